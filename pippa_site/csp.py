"""A Content-Security-Policy header on every response (Django 5.2 has none built in).

The default lets the pages do what they do and nothing more: scripts and styles only from
our own static files (no inline script, style or event handler anywhere in templates/), the
live WebSocket to this host, no plugins, no framing, forms posted only here. The setting
CONTENT_SECURITY_POLICY replaces it whole; a response that already has the header keeps it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from asgiref.sync import iscoroutinefunction
from django.conf import settings
from django.core.exceptions import DisallowedHost
from django.http import HttpRequest, HttpResponseBase
from django.utils.decorators import sync_and_async_middleware

HEADER = "Content-Security-Policy"
DEFAULT = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "font-src 'self'; connect-src 'self'{sockets}; object-src 'none'; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'"
)


def policy(request: HttpRequest) -> str:
    if settings.CONTENT_SECURITY_POLICY:
        return str(settings.CONTENT_SECURITY_POLICY)
    # 'self' covers ws:/wss: to this host in current browsers; older ones need it spelled out.
    try:
        host = request.get_host()
    except DisallowedHost:  # the response is Django's 400; it needs no socket
        return DEFAULT.format(sockets="")
    scheme = "wss" if request.is_secure() else "ws"
    return DEFAULT.format(sockets=f" {scheme}://{host}")


def _add(request: HttpRequest, response: HttpResponseBase) -> HttpResponseBase:
    if HEADER not in response:
        response[HEADER] = policy(request)
    return response


@sync_and_async_middleware
def content_security_policy(get_response: Callable[[HttpRequest], Any]) -> Any:
    if iscoroutinefunction(get_response):

        async def middleware(request: HttpRequest) -> HttpResponseBase:
            response = await get_response(request)
            return _add(request, response)

        return middleware

    def sync_middleware(request: HttpRequest) -> HttpResponseBase:
        return _add(request, get_response(request))

    return sync_middleware
