"""`manage.py demo_receiver`: a small local HTTP receiver the plans in examples/ run against.

It stands in for the world a first plan talks to — a plumber's quote, a bank that pays, a family
chat, the weather — on 127.0.0.1:8025 by default, and prints each request it gets. The bank
deduplicates on `Idempotency-Key` as a real payment API does: a payment repeated with the same
key is answered with the first receipt and paid once.

    GET  /quote      {"amount": 120, "currency": "EUR", "from": "Plumber Schmidt"}
    POST /pay        {"amount": N, ...} -> {"paid": N, "receipt": "R-1"}
    POST /messages   {"text": "..."}    -> {"ok": true, "id": 1}
    GET  /weather    {"city": "Berlin", "today": "sunny", "high_c": 21}

The http tools refuse this host unless the operator allows it: run the loop with
`LOOP_HTTP_ALLOW=127.0.0.1:8025` (README "First five minutes").
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

QUOTE = {"amount": 120, "currency": "EUR", "from": "Plumber Schmidt"}
WEATHER = {"city": "Berlin", "today": "sunny", "high_c": 21}
MAX_BODY = 64 * 1024


class DemoWorld:
    """What the receiver remembers: payments by idempotency key, messages in order."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.payments: dict[str, dict[str, Any]] = {}
        self.messages: list[dict[str, Any]] = []

    def pay(self, key: str, body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        with self.lock:
            if key and key in self.payments:
                return self.payments[key], False
            receipt = {"paid": body.get("amount"), "receipt": f"R-{len(self.payments) + 1}"}
            self.payments[key or f"no-key-{len(self.payments)}"] = receipt
            return receipt, True

    def message(self, body: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self.messages.append(body)
            return {"ok": True, "id": len(self.messages)}


def handler(world: DemoWorld, say: Any) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "PippaDemoReceiver/1"

        def answer(self, status: int, data: dict[str, Any]) -> None:
            body = json.dumps(data).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802
            found = {"/quote": QUOTE, "/weather": WEATHER}.get(self.path.split("?")[0])
            say(f"GET {self.path} -> {200 if found else 404}")
            self.answer(200, found) if found else self.answer(404, {"error": "no such page"})

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                self.answer(413, {"error": "body too large"})
                return
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except ValueError:
                self.answer(400, {"error": "the body is not JSON"})
                return
            if not isinstance(body, dict):
                self.answer(400, {"error": "the body is not a JSON object"})
                return
            path = self.path.split("?")[0]
            if path == "/pay":
                key = self.headers.get("Idempotency-Key", "")
                receipt, new = world.pay(key, body)
                said = "paid" if new else "already paid (same Idempotency-Key), not again"
                say(f"POST /pay {body.get('amount')}: {said} {receipt['receipt']}")
                self.answer(200, receipt)
            elif path == "/messages":
                kept = world.message(body)
                say(f"POST /messages: {body.get('text', '')!s:.80}")
                self.answer(200, kept)
            else:
                say(f"POST {self.path} -> 404")
                self.answer(404, {"error": "no such page"})

        def log_message(self, *args: Any) -> None:
            pass  # each request is said once, by `say`

    return Handler


class Command(BaseCommand):
    help = (
        "A small local HTTP receiver for the plans in examples/ (a quote, a bank that "
        "deduplicates on Idempotency-Key, a chat, the weather); prints each request. Ctrl-C stops."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8025)

    def handle(self, *args: Any, **options: Any) -> None:
        def say(line: str) -> None:
            self.stdout.write(line)
            self.stdout.flush()

        server = ThreadingHTTPServer((options["host"], options["port"]), handler(DemoWorld(), say))
        say(f"demo receiver at http://{options['host']}:{options['port']}/ (Ctrl-C stops)")
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()
