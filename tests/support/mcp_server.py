"""A real MCP server written with the SDK's `MCPServer`, for the tests and the bench.

    python tests/support/mcp_server.py stdio
    python tests/support/mcp_server.py http PORT

Tools: `lookup` (read-only, says so), `send` (a side effect: each call is one line in the log
file MCP_LOG, written when the call arrives (before any sleep), with the request's idempotency key; it then sleeps
MCP_SLOW seconds, once, when its text says "slow"), `put` (a side effect the server calls
idempotent), `echo_header` (answers with a header it was sent), `fail` (answers
isError). Pure SDK: no Django.
"""

from __future__ import annotations

import json
import os
import sys
import time

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations

server = MCPServer("pippa-test")
LOG = os.environ.get("MCP_LOG", "")
_slept: set[str] = set()


def _slow(why: str) -> None:
    """Sleep MCP_SLOW seconds, once for each `why` (a call sent again answers at once)."""
    if why not in _slept:
        _slept.add(why)
        time.sleep(float(os.environ.get("MCP_SLOW", "30")))


def _log(tool: str, args: dict[str, object], ctx: Context) -> None:
    meta = ctx.request_context.meta or {}
    key = meta.get("io.pippa/idempotency-key")
    if LOG:
        with open(LOG, "a") as out:
            out.write(json.dumps({"tool": tool, "args": args, "key": key}) + "\n")
            out.flush()
            os.fsync(out.fileno())


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def lookup(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


@server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False))
def send(to: str, text: str, ctx: Context) -> str:
    """Send a message to someone."""
    _log("send", {"to": to, "text": text}, ctx)
    if "slow" in text:
        _slow(text)
    return f"sent to {to}"


@server.tool(annotations=ToolAnnotations(idempotent_hint=True))
def put(name: str, value: int, ctx: Context) -> str:
    """Set a named value (the same call twice is the same as once)."""
    _log("put", {"name": name, "value": value}, ctx)
    if name.startswith("slow"):
        _slow(name)
    return f"{name}={value}"


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def echo_header(name: str, ctx: Context) -> str:
    """The value of a request header this server was sent (over HTTP), or '' (it echoes it)."""
    value = (ctx.headers or {}).get(name.lower(), "")
    _log("echo_header", {"name": name, "value": value}, ctx)
    return value


@server.tool()
def fail(why: str) -> str:
    """Always refuses."""
    raise ToolError(why)


if __name__ == "__main__":
    if sys.argv[1:2] == ["http"]:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run("stdio")
