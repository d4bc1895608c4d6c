"""Real sinks for side-effect tests: an SMTP server and an HTTP receiver on 127.0.0.1 that
record every delivery, so a test knows the truth about what reached the world.

Each delivery is checked against the database as it arrives (a plain `sqlite3` reader, so it
sees only what was committed): an email or a POST may only arrive while its effect row is
committed `running` — claimed, under a committed intent. Anything else is a violation.

The HTTP receiver may deduplicate on `Idempotency-Key`, as payment APIs do (`dedupe=True`): the
first request with a key is the action, recorded as a delivery; a later one with that key gets
the stored answer and is recorded as a replay, not a second action (while the first is still
being answered, it gets 409, as the IETF Idempotency-Key draft says).
"""

from __future__ import annotations

import asyncio
import email
import json
import random
import select
import socket
import sqlite3
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import psycopg
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP


@dataclass
class Delivery:
    key: str  # Idempotency-Key, or the Message-ID
    where: str  # the URL path, or the recipients
    body: str
    effect_state: str  # the effect's committed state when it arrived


@dataclass
class _Record:
    db_path: str | None  # a DATABASE_URL: sqlite:///… or postgres://…
    max_delay_ms: int
    deliveries: list[Delivery] = field(default_factory=list)
    replays: list[Delivery] = field(default_factory=list)  # repeats a deduplicating sink answered
    violations: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    in_flight: int = 0

    def committed_state(self, where: str, params: tuple[Any, ...]) -> str:
        """The effect's state as committed, read on a connection of our own."""
        if not self.db_path:
            return "?"
        sql = f"SELECT state FROM loop_effect WHERE {where}"  # noqa: S608
        if self.db_path.startswith("postgres://"):
            with psycopg.connect(self.db_path, autocommit=True) as pg:
                row = pg.execute(sql.replace("?", "%s"), params).fetchone()
        else:
            with sqlite3.connect(self.db_path.removeprefix("sqlite:///"), timeout=30) as db:
                row = db.execute(sql, params).fetchone()
        return row[0] if row else "(no intent)"

    def add(self, delivery: Delivery, *, replay: bool = False) -> None:
        with self.lock:
            (self.replays if replay else self.deliveries).append(delivery)
            if self.db_path and delivery.effect_state != "running":
                self.violations.append(
                    f"{delivery.key} arrived while its effect was {delivery.effect_state}"
                )

    def delay(self) -> float:
        """Sometimes answer a few ms late, to widen the window between send and record."""
        if self.max_delay_ms and random.random() < 0.5:
            return random.uniform(0, self.max_delay_ms) / 1000
        return 0.0

    def counts(self) -> Counter[str]:
        with self.lock:
            return Counter(d.key for d in self.deliveries)

    def keys(self) -> set[str]:
        with self.lock:
            return {d.key for d in self.deliveries}


class HttpSink:
    """POST /hook/<name> records the Idempotency-Key and answers 200 at once (or a few ms
    late). GET /probe/<key> answers 200 if a POST to a probe-able hook carried that key, 503
    ("can't tell") if one to another hook did, 404 if none did. GET /ping answers 200. With
    `dedupe`, a POST that repeats a key is answered from the first one's answer (a replay)."""

    def __init__(
        self,
        *,
        db_path: str | None = None,
        max_delay_ms: int = 0,
        probeable: str = "/hook/probe",
        dedupe: bool = False,
        bind: str = "127.0.0.1",
        url_host: str = "",
    ) -> None:
        """`bind` and `url_host`: where it listens and the host its URLs name (the nemesis
        binds every address, for workers in network namespaces)."""
        self.url_host = url_host
        self.record = _Record(db_path, max_delay_ms)
        self.probeable = probeable
        self.probes = 0
        self.dedupe = dedupe
        self.answers: dict[str, Any] = {}  # key -> the stored answer (None: being answered)
        sink = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _answer(self, status: int, payload: Any) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length).decode()
                if len(body.encode()) < length:
                    return  # the sender died mid-request: nothing was delivered
                key = self.headers.get("Idempotency-Key") or ""
                state = sink.record.committed_state("id = ?", (key,))
                delivery = Delivery(key, self.path, body, state)
                if sink.dedupe:
                    with sink.record.lock:
                        seen = key in sink.answers
                        stored = sink.answers.get(key)
                        if not seen:
                            sink.answers[key] = None  # being answered
                    if seen:
                        sink.record.add(delivery, replay=True)
                        if stored is None:
                            self._answer(409, {"error": "a request with this key is in progress"})
                        else:
                            self._answer(200, stored)
                        return
                sink.record.add(delivery)
                time.sleep(sink.record.delay())
                answer = {"received": key}
                with sink.record.lock:
                    sink.answers[key] = answer
                self._answer(200, answer)

            def do_GET(self) -> None:
                if self.path.startswith("/probe/"):
                    sink.probes += 1
                    key = self.path.removeprefix("/probe/")
                    paths = {d.where for d in sink.record.deliveries if d.key == key}
                    if sink.probeable in paths:
                        self._answer(200, {"known": key})
                    elif paths:
                        self._answer(503, {"unknown": key})
                    else:
                        self._answer(404, {"unknown": key})
                else:
                    self._answer(200, {"pong": True})

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a sender killed mid-request resets its connection: expected here

            def process_request(self, request: Any, client_address: Any) -> None:
                with sink.record.lock:
                    sink.record.in_flight += 1
                super().process_request(request, client_address)

            def shutdown_request(self, request: Any) -> None:
                super().shutdown_request(request)
                with sink.record.lock:
                    sink.record.in_flight -= 1

        self.server = Server((bind, 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> HttpSink:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def url(self, path: str) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{self.url_host or host}:{port}{path}"

    def idle(self) -> bool:
        """No connection open or waiting to be accepted: every request sent has been read."""
        pending, _, _ = select.select([self.server.socket], [], [], 0)
        with self.record.lock:
            return not pending and self.record.in_flight == 0


class SmtpSink:
    """An SMTP server recording every message it accepted, by Message-ID."""

    def __init__(self, *, db_path: str | None = None, max_delay_ms: int = 0) -> None:
        self.record = _Record(db_path, max_delay_ms)
        record = self.record

        class Handler:
            async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
                message = email.message_from_bytes(envelope.original_content or b"")
                key = str(message.get("Message-ID", "")).strip()
                prefix = key.strip("<>").split("@", 1)[0]
                state = record.committed_state("substr(id, 1, 40) = ?", (prefix,))
                body = message.get_payload()
                record.add(Delivery(key, ",".join(envelope.rcpt_tos), str(body), state))
                await asyncio.sleep(record.delay())
                return "250 Message accepted for delivery"

        class Counting(SMTP):
            def connection_made(self, transport: Any) -> None:
                with record.lock:
                    record.in_flight += 1
                super().connection_made(transport)

            def connection_lost(self, exc: Exception | None) -> None:
                super().connection_lost(exc)
                with record.lock:
                    record.in_flight -= 1

        class Counted(Controller):
            def factory(self) -> SMTP:
                return Counting(self.handler, **self.SMTP_kwargs)

        self.port = free_port()
        self.controller = Counted(Handler(), hostname="127.0.0.1", port=self.port)

    def __enter__(self) -> SmtpSink:
        self.controller.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.controller.stop()

    def idle(self) -> bool:
        with self.record.lock:
            return self.record.in_flight == 0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
