"""Sessions with the MCP servers, kept open and reconnected (DESIGN.md §18), through the
official SDK's `ClientSession` over its stdio and streamable-HTTP transports.

The SDK is async; the loop is not. One daemon thread runs an event loop holding one session per
server (each in a task of its own, as the SDK's transports want); `Pool.call` and
`Pool.list_tools` hand work to it and wait. A session that broke is dropped and opened afresh
on the next call.

How far a call got decides its outcome (§6):

    open the session, ping it     a failure here sent nothing: `NotSent`
    tools/call written            an error answer (a JSON-RPC error) is the server's no:
                                  `Refused`; a connection lost or a timeout: `Lost` (uncertain)
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import mcp_types as types
from mcp import ClientSession, MCPError, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

from ..tools import vault
from .config import Server
from .outcomes import Lost, NotSent, Refused

T = TypeVar("T")
PING_SECONDS = 5.0
KEY = "io.pippa/idempotency-key"


class _Connection:
    def __init__(self, server: Server) -> None:
        self.server = server
        self.session: ClientSession | None = None
        self.stop: asyncio.Event | None = None
        self.task: asyncio.Task[None] | None = None
        self.opening = asyncio.Lock()

    @property
    def open(self) -> bool:
        return self.session is not None and self.task is not None and not self.task.done()


class Pool:
    """One session per server, opened when first needed and again after it broke."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self._connections: dict[str, _Connection] = {}

    # ---- the thread's side --------------------------------------------------------------

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="loop-mcp", daemon=True).start()
                self._loop = loop
            return self._loop

    def _run(self, make: Callable[[], Awaitable[T]], timeout: float) -> T:
        async def run() -> T:
            return await make()

        future = asyncio.run_coroutine_threadsafe(run(), self._event_loop())
        return future.result(timeout=timeout + PING_SECONDS + 5)

    async def _session(self, server: Server) -> ClientSession:
        """The server's open session, opened now if it is not; NotSent if it can't be."""
        conn = self._connections.get(server.name)
        if conn is None or conn.server != server:
            if conn is not None:
                await self._drop(conn)
            conn = self._connections[server.name] = _Connection(server)
        async with conn.opening:  # calls at once (a worker's batch) open one session
            if conn.open:
                assert conn.session is not None
                return conn.session
            ready: asyncio.Future[ClientSession] = asyncio.get_running_loop().create_future()
            conn.stop = asyncio.Event()
            conn.task = asyncio.create_task(_hold(conn, ready))
            try:
                return await asyncio.wait_for(ready, timeout=server.timeout)
            except Exception as exc:
                await self._drop(conn)
                raise NotSent(
                    f"can't open a session with MCP server '{server.name}': {_why(exc)}"
                ) from None

    async def _drop(self, conn: _Connection) -> None:
        conn.session = None
        if conn.stop is not None:
            conn.stop.set()
        if conn.task is not None and not conn.task.done():
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(asyncio.shield(conn.task), timeout=5)
            conn.task.cancel()

    async def _live(self, server: Server) -> ClientSession:
        """An open session that just answered a ping (reopened once if it did not)."""
        for again in (False, True):
            session = await self._session(server)
            try:
                with anyio.fail_after(min(PING_SECONDS, server.timeout)):
                    await session.send_ping()
                return session
            except Exception as exc:
                await self._drop(self._connections[server.name])
                if again:
                    raise NotSent(
                        f"MCP server '{server.name}' does not answer: {_why(exc)}"
                    ) from None
        raise AssertionError("unreachable")

    # ---- the caller's side ---------------------------------------------------------------

    def list_tools(self, server: Server) -> list[types.Tool]:
        async def listing() -> list[types.Tool]:
            session = await self._live(server)
            found: list[types.Tool] = []
            cursor: str | None = None
            try:
                with anyio.fail_after(server.timeout):
                    while True:
                        params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
                        page = await session.list_tools(params=params)
                        found.extend(page.tools)
                        cursor = page.next_cursor
                        if not cursor:
                            return found
            except Exception as exc:
                await self._drop(self._connections[server.name])
                raise NotSent(
                    f"MCP server '{server.name}' did not list its tools: {_why(exc)}"
                ) from None

        return self._run(listing, server.timeout)

    def call(
        self, server: Server, tool: str, args: dict[str, Any], key: str | None = None
    ) -> types.CallToolResult:
        """tools/call on `server`; NotSent, Refused or Lost as the module says."""

        async def calling() -> types.CallToolResult:
            session = await self._live(server)
            meta: Any = {KEY: key} if key else None
            try:
                return await session.call_tool(
                    tool, args, read_timeout_seconds=server.timeout, meta=meta
                )
            except MCPError as exc:
                if exc.code in (CONNECTION_CLOSED, REQUEST_TIMEOUT):
                    await self._drop(self._connections[server.name])
                    raise Lost(f"MCP server '{server.name}': {exc.message}") from None
                raise Refused(f"MCP server '{server.name}' refused: {exc.message}") from None
            except Exception as exc:
                await self._drop(self._connections[server.name])
                raise Lost(f"MCP server '{server.name}': {_why(exc)}") from None

        return self._run(calling, server.timeout)

    def close(self) -> None:
        """Close every session (the worker's shutdown; tests)."""
        if self._loop is None:
            return

        async def closing() -> None:
            for conn in list(self._connections.values()):
                await self._drop(conn)
            self._connections.clear()

        with contextlib.suppress(Exception):
            self._run(closing, 5)


async def _hold(conn: _Connection, ready: asyncio.Future[ClientSession]) -> None:
    """Open the server's session, hand it over through `ready`, and keep it until `conn.stop`
    (entered and left in this one task, as the SDK's transports need)."""
    server = conn.server
    try:
        async with contextlib.AsyncExitStack() as stack:
            if server.command:
                env, _ = vault.resolve(server.env)
                params = StdioServerParameters(
                    command=server.command[0], args=list(server.command[1:]), env=env or None
                )
                read, write = await stack.enter_async_context(stdio_client(params))
            else:
                headers, _ = vault.resolve(server.headers)
                client = await stack.enter_async_context(create_mcp_http_client(headers=headers))
                read, write = await stack.enter_async_context(
                    streamable_http_client(server.url, http_client=client)
                )
            session = await stack.enter_async_context(
                ClientSession(read, write, read_timeout_seconds=server.timeout)
            )
            await session.initialize()
            conn.session = session
            ready.set_result(session)
            assert conn.stop is not None
            await conn.stop.wait()
    except BaseException as exc:
        if not ready.done():
            ready.set_exception(exc if isinstance(exc, Exception) else NotSent("cancelled"))
        if not isinstance(exc, Exception):
            raise
    finally:
        conn.session = None


def _why(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        return _why(exc.exceptions[0])
    if isinstance(exc, TimeoutError | asyncio.TimeoutError):
        return "timed out"
    text = str(exc) or type(exc).__name__
    return vault.shown(text)


POOL = Pool()
