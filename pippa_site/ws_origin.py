"""The live socket answers pages of this site only: a browser's WebSocket handshake carries
the page's Origin and the user's cookies, and the same-origin policy does not apply to it.

Channels' AllowedHostsOriginValidator compares the Origin's host with ALLOWED_HOSTS and
ignores the port, so a page on any other port of the same host (http://127.0.0.1:3000, a dev
server, anything else the machine serves) could open the socket with Dad's session and read
every live update. Like Django's CSRF check for a POST, the Origin must be this request's own
host and port (its Host header) or one of CSRF_TRUSTED_ORIGINS. (A handshake without an
Origin is refused by Channels' validator, which still runs after this.)
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from django.conf import settings


def allowed(origin: str, host: str) -> bool:
    if origin in settings.CSRF_TRUSTED_ORIGINS:
        return True
    parts = urlsplit(origin)
    return parts.scheme in ("http", "https") and bool(host) and parts.netloc.lower() == host.lower()


class SameOriginOnly:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope["type"] == "websocket":
            headers = dict(scope.get("headers") or [])
            origin = headers.get(b"origin")
            host = headers.get(b"host", b"").decode("latin-1")
            if origin is not None and not allowed(origin.decode("latin-1"), host):
                await send({"type": "websocket.close"})  # before accepting: a 403
                return None
        return await self.app(scope, receive, send)
