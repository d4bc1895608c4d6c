"""A scripted OpenAI-compatible model server the tests start: a real HTTP server on 127.0.0.1
answering `POST /v1/chat/completions` from a script, and recording every request.

    with ModelServer([call("echo", value=1), commit(output={"n": 1})]) as model:
        model.base_url          # http://127.0.0.1:PORT/v1 (LOOP_LLM_BASE_URL)
        model.requests          # every request body, in order (JSON)

A script is a list (one item per request, in turn) or a function `(request, n) -> item`.
An item is a reply (`say`, `call`, `calls`, `commit`; a reply's `usage` and `finish_reason`
may be given too), `Status(code, headers)` (an error answer), `Body(value, code)` (any JSON
value as the whole body), `Raw(data, code)` (any bytes as the whole body), `Slow(seconds,
item)`, `Refuse(seconds)` (drop this connection and refuse new ones for that long), or a
callable run first (e.g. to SIGKILL a process) whose return value is the item.

`GET /v1/models` answers a list of one model, as a real server does (a client's probe).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Item = Any
Script = list[Item] | Callable[[dict[str, Any], int], Item]


@dataclass(frozen=True)
class Status:
    code: int
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Refuse:
    seconds: float


@dataclass(frozen=True)
class Body:
    """Answer `value`, any JSON value (NaN, a lone surrogate and huge numbers included), as
    the whole body: `{"choices": []}`, a list, a string."""

    value: Any
    code: int = 200


@dataclass(frozen=True)
class Raw:
    """Answer `data`, any bytes (not JSON, not UTF-8, megabytes), as the whole body."""

    data: bytes
    code: int = 200
    content_type: str = "application/json"


@dataclass(frozen=True)
class Slow:
    """Answer `then`, after `seconds` (a client with a shorter timeout has given up)."""

    seconds: float
    then: Any


def say(text: str) -> dict[str, Any]:
    return {"content": text}


def calls(*pairs: tuple[str, dict[str, Any] | str], text: str = "") -> dict[str, Any]:
    """A reply with these tool calls: (name, args) — args as a dict, or raw text as the model
    wrote it."""
    return {"content": text, "tool_calls": list(pairs)}


def call(name: str, **args: Any) -> dict[str, Any]:
    return calls((name, args))


def commit(verdict: str = "done", **fields: Any) -> dict[str, Any]:
    return call("commit_step", verdict=verdict, **fields)


class ModelServer:
    def __init__(self, script: Script) -> None:
        self.script = script
        self.requests: list[dict[str, Any]] = []
        self.answered = 0  # replies sent (not error answers)
        # Time spent answering, from the request's first line read to the answer sent.
        self.server_seconds = 0.0
        self._lock = threading.Lock()
        self._calls = 0
        self._server: ThreadingHTTPServer | None = None
        self.port = 0

    def __enter__(self) -> ModelServer:
        self._serve()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def last_messages(self) -> list[dict[str, Any]]:
        return list(self.requests[-1]["messages"]) if self.requests else []

    def tool_names(self, n: int = -1) -> list[str]:
        return [t["function"]["name"] for t in self.requests[n].get("tools", [])]

    # ---- the server ----------------------------------------------------------------------

    def _serve(self) -> None:
        model = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def setup(self) -> None:
                super().setup()
                # Headers and body go out in separate writes: without this, Nagle's algorithm
                # and the client's delayed ACK hold each answer ~40 ms (no real server does).
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def do_GET(self) -> None:
                if self.path.rstrip("/") == "/v1/models":
                    self._send(
                        200, {"object": "list", "data": [{"id": "pippa", "object": "model"}]}
                    )
                else:
                    self._send(404, {"error": {"message": f"no {self.path}"}})

            def parse_request(self) -> bool:
                self.began = time.perf_counter()  # the request line is in: the server's time
                return super().parse_request()

            def do_POST(self) -> None:
                began = self.began
                try:
                    self._post()
                finally:
                    with model._lock:
                        model.server_seconds += time.perf_counter() - began

            def _post(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                if self.path.rstrip("/") != "/v1/chat/completions":
                    self._send(404, {"error": {"message": f"no {self.path}"}})
                    return
                with model._lock:
                    n = len(model.requests)
                    model.requests.append(body)
                item = model._item(body, n)
                while callable(item) and not isinstance(item, dict):
                    item = item()
                if isinstance(item, Slow):
                    time.sleep(item.seconds)
                    item = item.then
                if isinstance(item, Refuse):
                    model._refuse(item.seconds)
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if isinstance(item, Status):
                    self._send(
                        item.code, {"error": {"message": f"scripted {item.code}"}}, item.headers
                    )
                    return
                if isinstance(item, Body):
                    self._send(item.code, item.value)
                    return
                if isinstance(item, Raw):
                    self._send_bytes(item.code, item.data, {"Content-Type": item.content_type})
                    return
                self._send(200, model._completion(item, body))
                with model._lock:
                    model.answered += 1

            def _send(self, code: int, payload: Any, headers: dict[str, str] | None = None) -> None:
                data = json.dumps(payload).encode()
                self._send_bytes(
                    code, data, {"Content-Type": "application/json", **(headers or {})}
                )

            def _send_bytes(self, code: int, data: bytes, headers: dict[str, str]) -> None:
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                try:
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up waiting (a timeout): that is the point

        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = True
        server.allow_reuse_address = True
        self.port = server.server_address[1]
        self._server = server
        threading.Thread(target=server.serve_forever, daemon=True).start()

    def _stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def _refuse(self, seconds: float) -> None:
        """Close the listening socket (connections are refused), open it again later."""

        def later() -> None:
            self._stop()
            time.sleep(seconds)
            self._serve()

        threading.Thread(target=later, daemon=True).start()
        time.sleep(0.1)  # the listener is closed before this answer's connection drops

    def _item(self, body: dict[str, Any], n: int) -> Item:
        if callable(self.script):
            return self.script(body, n)
        with self._lock:
            if not self.script:
                return Status(500, {})
            return self.script.pop(0)

    def _completion(self, item: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
        tool_calls = []
        for name, args in item.get("tool_calls", []):
            with self._lock:
                self._calls += 1
                call_id = f"call_{self._calls}_{time.monotonic_ns()}"
            arguments = args if isinstance(args, str) else json.dumps(args)
            tool_calls.append(
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": arguments},
                }
            )
        message: dict[str, Any] = {"role": "assistant", "content": item.get("content") or None}
        if tool_calls:
            message["tool_calls"] = tool_calls
        prompt = sum(len(json.dumps(m)) for m in body.get("messages", [])) // 4
        completion = len(json.dumps(message)) // 4
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
        finish = "tool_calls" if tool_calls else "stop"
        return {
            "id": f"chatcmpl-{len(self.requests)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "pippa"),
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": item.get("finish_reason", finish),
                }
            ],
            "usage": item.get("usage", usage),
        }


def tool_results(messages: list[dict[str, Any]]) -> list[str]:
    return [m["content"] for m in messages if m["role"] == "tool"]


def briefings(messages: list[dict[str, Any]]) -> list[str]:
    return [m["content"] for m in messages if m["role"] == "user"]
