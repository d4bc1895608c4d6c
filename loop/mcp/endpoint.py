"""Pippa Loop's MCP server over streamable HTTP at /mcp (`serve`), in front of the site's ASGI
app (pippa_site/asgi.py): a request to /mcp must carry an agent's bearer token, checked as the
API checks it (hashed, throttled, expired or revoked refused: `loop.api.core.authenticate`),
and each tool then calls the API with that same token. Stateless: each request stands alone."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from django.core.exceptions import DisallowedHost
from django.core.handlers.asgi import ASGIRequest
from django.db import close_old_connections

if TYPE_CHECKING:
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

Scope = MutableMapping[str, Any]
ASGIApp = Callable[..., Awaitable[None]]
PATH = "/mcp"


def _authenticate(scope: Scope) -> tuple[int, str, str]:
    """(status, message, bearer): 200 for a live agent token, else the API's refusal."""
    from ..api.core import NoAgent, authenticate

    close_old_connections()
    try:
        request = ASGIRequest(dict(scope), io.BytesIO())
        try:
            request.get_host()  # the site's ALLOWED_HOSTS guard this door too
        except DisallowedHost as exc:
            return 400, str(exc), ""
        agent = authenticate(request)
        if isinstance(agent, NoAgent):
            return agent.status, str(agent.message), ""
        return 200, "", request.headers["Authorization"].partition(" ")[2].strip()
    finally:
        close_old_connections()


class Endpoint:
    """ASGI: /mcp to the MCP server behind agent tokens, everything else to `app`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app  # the SDK is loaded with the first request to /mcp
        self.manager: StreamableHTTPSessionManager | None = None
        self.ready: asyncio.Event | None = None

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope.get("type") != "http" or scope.get("path", "").rstrip("/") != PATH:
            return await self.app(scope, receive, send)
        status, message, _ = await sync_to_async(_authenticate, thread_sensitive=False)(scope)
        if status != 200:
            return await _refuse(send, status, message)
        await self._started()
        assert self.manager is not None
        await self.manager.handle_request(scope, receive, send)

    async def _started(self) -> None:
        """The session manager runs in a task of its own for the life of the process."""
        if self.ready is None:
            from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
            from mcp.server.transport_security import TransportSecuritySettings

            from . import serve

            self.ready = asyncio.Event()
            self.manager = StreamableHTTPSessionManager(
                app=serve.build()._lowlevel_server,
                stateless=True,
                json_response=True,
                # The site's own ALLOWED_HOSTS and the token guard this door.
                security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
            )
            asyncio.get_running_loop().create_task(self._run(self.manager, self.ready))
        await self.ready.wait()

    @staticmethod
    async def _run(manager: StreamableHTTPSessionManager, ready: asyncio.Event) -> None:
        async with manager.run():
            ready.set()
            await asyncio.Event().wait()


async def _refuse(send: Any, status: int, message: str) -> None:
    body = json.dumps({"detail": message, "error": message}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
