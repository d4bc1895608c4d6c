"""Degrade, don't fail (DESIGN.md §8): while the database is unreachable or refuses writes (a
full disk), a page or an API call answers 503 with a short reason — JSON under /api/ —, never
a 500 with a traceback; nothing half-done stays (each action's transaction rolled back).

    Unavailable       middleware: an exception a view raised (ninja's API views re-raise
                      theirs) that says the database is unavailable becomes that 503
    server_error      handler500: the same for one raised outside a view (a session saved
                      by the middleware), any other error still the usual 500
    SocketUnavailable the live socket's guard: such an error (or the channel layer's: Redis
                      down) closes the socket with UNAVAILABLE, which the page shows as
                      "live updates paused" and retries later, instead of 1011 and a traceback

Each reason is logged once a minute at most, as one line, not once per request.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import Any

from django.db import DatabaseError, InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template.loader import render_to_string
from django.views import defaults

log = logging.getLogger("loop.web.unavailable")

UNAVAILABLE = 4503  # the live socket's close code: paused, try again later (live.js)
RETRY_AFTER_SECONDS = 5
SAY_EVERY_SECONDS = 60.0
_said: dict[str, float] = {}


def reason_of(exc: BaseException | None) -> str:
    """Why the database cannot serve this request, if `exc` (or what caused it) says it is
    unreachable or refusing writes; '' for any other error, a bug, which stays a 500."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, OperationalError | InterfaceError):
            line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            if "full" in line or "space" in line:
                return f"writes failing: {line}"
            return f"database unavailable: {line}"
        if not isinstance(exc, DatabaseError):
            return ""
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return ""


def say_once(reason: str, where: str) -> None:
    """One line per reason a minute, however many requests meet it."""
    now = time.monotonic()
    if now - _said.get(reason, -SAY_EVERY_SECONDS) >= SAY_EVERY_SECONDS:
        _said[reason] = now
        log.warning("%s answered 503: %s (said once a minute)", where, reason)


def answer(request: HttpRequest, reason: str) -> HttpResponse:
    """The 503: JSON under /api/ (and for /healthz's kind of client), else a small page that
    needs neither the session nor the database."""
    say_once(reason, "the site")
    response: HttpResponse
    if request.path.startswith("/api/") or request.path == "/healthz":
        response = JsonResponse({"detail": reason, "error": reason}, status=503)
    else:
        html = render_to_string("loop/unavailable.html", {"reason": reason})
        response = HttpResponse(html, status=503)
    response["Retry-After"] = str(RETRY_AFTER_SECONDS)
    return response


class Unavailable:
    """Middleware (outermost but the headers'): see the module's docstring."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        reason = reason_of(exception)
        return answer(request, reason) if reason else None


def server_error(request: HttpRequest) -> HttpResponse:
    """handler500: the database's unavailability raised outside a view is a 503 too."""
    reason = reason_of(sys.exc_info()[1])
    if reason:
        return answer(request, reason)
    return defaults.server_error(request)


def _layer_failure(exc: BaseException) -> str:
    """Why the channel layer cannot be used, if `exc` is its failure (Redis down)."""
    try:
        import redis
    except ImportError:  # pragma: no cover - redis is a requirement
        return ""
    if isinstance(exc, redis.RedisError | ConnectionError | OSError | TimeoutError):
        return f"live updates paused: the channel layer does not answer ({type(exc).__name__})"
    return ""


class SocketUnavailable:
    """ASGI middleware around the live socket's stack (session, user, consumer): a failure of
    the database or the channel layer closes the socket with UNAVAILABLE, said once a minute,
    rather than ending the connection with 1011 and a traceback at every reconnect."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        accepted = closed = False

        async def sending(message: dict[str, Any]) -> None:
            nonlocal accepted, closed
            if message["type"] == "websocket.accept":
                accepted = True
            elif message["type"] == "websocket.close":
                closed = True
            await send(message)

        try:
            await self.inner(scope, receive, sending)
        except Exception as exc:
            reason = reason_of(exc) or _layer_failure(exc)
            if not reason:
                raise
            say_once(reason, "the live socket")
            if closed:
                return
            if not accepted:
                await send({"type": "websocket.accept"})
            await send({"type": "websocket.close", "code": UNAVAILABLE, "reason": reason[:120]})
