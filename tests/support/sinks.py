"""Real sinks the tests start: an HTTP receiver and an SMTP server that record every delivery.

with Receiver() as receiver:
    receiver.behave("500")            # the next POST/PUT answers 500 (then back to 200)
    receiver.url("/hook")             # http://127.0.0.1:PORT/hook
    receiver.probe_url                # …/keys/{key}: 200 if it processed that key, else 404
    receiver.posts                    # every POST/PUT it received, in order
    Receiver(dedupe=True)             # acts on each Idempotency-Key once, as a payment API does
    receiver.acted                    # the POST/PUTs it acted on (all of them, unless dedupe)
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from email import message_from_bytes
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from aiosmtpd.controller import Controller

# Ways the receiver answers a write: "ok" 200; "500"; "408"; "400"; "409"; "429" (Retry-After: 7);
# "hang": hold the request (after reading it) until released or the test ends, then 200.
BEHAVIOURS = {"ok", "500", "408", "400", "409", "429", "hang"}


@dataclass
class Request:
    method: str
    path: str
    key: str | None
    body: bytes
    headers: dict[str, str]

    @property
    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Receiver:
    dedupe: bool = False  # a key it acted on is answered again without acting
    requests: list[Request] = field(default_factory=list)
    acted: list[Request] = field(default_factory=list)
    processed: set[str] = field(default_factory=set)  # keys it acted on (what the probe knows)
    _plan: list[str] = field(default_factory=list)
    _release: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __enter__(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                if self.path.startswith("/keys/"):
                    known = self.path.removeprefix("/keys/") in receiver.processed
                    self._answer(200 if known else 404, {"known": known})
                else:
                    self._answer(200, {"hello": "world"})

            def do_POST(self) -> None:
                self._write()

            def do_PUT(self) -> None:
                self._write()

            def _write(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                key = self.headers.get("Idempotency-Key")
                with receiver._lock:
                    request = Request(self.command, self.path, key, body, dict(self.headers))
                    receiver.requests.append(request)
                    if receiver.dedupe and key and key in receiver.processed:
                        self._answer(200, {"received": len(body), "duplicate": True})
                        return
                    receiver.acted.append(request)
                    how = receiver._plan.pop(0) if receiver._plan else "ok"
                if how in ("ok", "hang") and key:
                    receiver.processed.add(key)  # acted on it; a held answer is only slow
                if how == "hang":
                    receiver._release.wait(120)
                if how == "429":
                    self._answer(429, {"error": "slow down"}, {"Retry-After": "7"})
                elif how in ("500", "408", "400", "409"):
                    self._answer(int(how), {"error": how})
                else:
                    self._answer(200, {"received": len(body)})

            def _answer(
                self, status: int, data: Any, headers: dict[str, str] | None = None
            ) -> None:
                raw = json.dumps(data).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(raw)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._release.set()
        self.server.shutdown()
        self.server.server_close()

    @property
    def base(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def url(self, path: str = "/hook") -> str:
        return self.base + path

    @property
    def probe_url(self) -> str:
        return self.base + "/keys/{key}"

    def behave(self, *how: str) -> None:
        """Answer the next writes this way, in order; then 200 again."""
        assert set(how) <= BEHAVIOURS, how
        with self._lock:
            self._plan.extend(how)

    def release(self) -> None:
        """Let held ("hang") requests answer."""
        self._release.set()

    @property
    def posts(self) -> list[Request]:
        with self._lock:
            return [r for r in self.requests if r.method in ("POST", "PUT")]


def closed_url(path: str = "/hook") -> str:
    """A URL on a port nobody listens on: the connection is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}{path}"


# ---- SMTP ------------------------------------------------------------------------------------


@dataclass
class Mailbox:
    """Every message the SMTP server accepted; `refuse_rcpt` answers RCPT with that reply."""

    messages: list[Any] = field(default_factory=list)
    refuse_rcpt: str | None = None

    async def handle_RCPT(
        self, server: Any, session: Any, envelope: Any, address: str, options: Any
    ) -> str:  # noqa: N802
        if self.refuse_rcpt:
            return self.refuse_rcpt
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802
        self.messages.append(message_from_bytes(envelope.content))
        return "250 Message accepted for delivery"


class _PortZeroController(Controller):
    """aiosmtpd's Controller on port 0: learn the port the kernel chose before the self-check."""

    def _trigger_server(self) -> None:
        assert self.server is not None
        self.port = self.server.sockets[0].getsockname()[1]
        super()._trigger_server()


def smtp_server(mailbox: Mailbox) -> Iterator[tuple[str, int]]:
    controller = _PortZeroController(mailbox, hostname="127.0.0.1", port=0)
    controller.start()
    try:
        yield controller.hostname, controller.port
    finally:
        controller.stop()
