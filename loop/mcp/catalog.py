"""MCP tools as loop tools: `mcp.<server>.<tool>` in the registry (`loop.tools`), with the
server's input schema (checked when a plan is written, refusals naming the field) and
description, and Dad's decision of what each is (DESIGN.md §18):

    read-only       the tool is in the server's `read_only` list, or the server is trusted and
                    the tool says `readOnlyHint`
    safe to repeat  in `safe_to_repeat`, or trusted and `idempotentHint`
    otherwise       a side effect, through the outbox (intent, fenced claim, the
                    CallToolResult as its receipt; the effect id in the request's _meta)

A server's tools are listed when the worker starts, when a plan first names one of them, and on
the tools page's "test connection"; the last listing is kept in the data directory
(`mcp-tools.json`), so a server that is down keeps its tools known and a call to it is that
step's retry.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.conf import settings

from .. import tools
from ..outcomes import EffectNotSent, EffectRejected, EffectUncertainError
from ..tools import shown, vault
from . import config
from .outcomes import Lost, NotSent, Refused

if TYPE_CHECKING:
    import mcp_types as types

    from .sessions import Pool

log = logging.getLogger("loop.mcp")
PREFIX = "mcp."
RESULT_CHARS = 64 * 1024  # a result (output, receipt) is kept to this much text
TYPES = {
    "string": "string",
    "number": "number",
    "integer": "integer",
    "boolean": "boolean",
    "object": "object",
    "array": "list",
}


@dataclass(frozen=True)
class Decision:
    """What Dad's configuration makes of one tool, beside what the server claims."""

    side_effect: bool
    safe_to_repeat: bool
    claims: dict[str, bool]  # the server's annotations, as it sent them
    why: str


def decide(server: config.Server, tool: str, annotations: dict[str, Any]) -> Decision:
    claims = {
        k: bool(annotations[k])
        for k in ("readOnlyHint", "idempotentHint", "destructiveHint", "openWorldHint")
        if annotations.get(k) is not None
    }
    if tool in server.read_only:
        return Decision(False, False, claims, "read-only: Dad's list")
    if server.trusted and claims.get("readOnlyHint"):
        return Decision(False, False, claims, "read-only: the trusted server says so")
    if tool in server.safe_to_repeat:
        return Decision(True, True, claims, "side effect, safe to repeat: Dad's list")
    if server.trusted and claims.get("idempotentHint"):
        return Decision(
            True, True, claims, "side effect, safe to repeat: the trusted server says so"
        )
    return Decision(True, False, claims, "side effect: not marked otherwise")


# ---- the servers --------------------------------------------------------------------------


def servers() -> dict[str, config.Server]:
    path = settings.LOOP_MCP_SERVERS
    return config.load(path) if path else {}


def _cache_path() -> Path:
    return Path(settings.DATA_DIR) / "mcp-tools.json"


def listings() -> dict[str, list[dict[str, Any]]]:
    """Each server's last listing of its tools (as the SDK read them), by server name."""
    return _cached()


def _cached() -> dict[str, list[dict[str, Any]]]:
    try:
        data = json.loads(_cache_path().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _keep(name: str, listing: list[dict[str, Any]]) -> None:
    data = _cached()
    data[name] = listing
    path = _cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".mcp-tools-")
    with os.fdopen(fd, "w") as out:
        json.dump(data, out)
    os.replace(tmp, path)


def discover(server: config.Server) -> list[types.Tool]:
    """List the server's tools now and register them (NotSent if it can't be reached)."""
    listed = _pool().list_tools(server)
    dumped = [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in listed]
    _keep(server.name, dumped)
    _register_all(server, dumped)
    return listed


def _register_all(server: config.Server, listing: list[dict[str, Any]]) -> None:
    """Register the listed tools, each replacing its older self, then forget the server's tools
    it no longer lists (never a moment with a listed tool missing)."""
    prefix = f"{PREFIX}{server.name}."
    listed = set()
    for spec in listing:
        if isinstance(spec, dict) and isinstance(spec.get("name"), str):
            made = _tool(server, spec)
            tools.unregister(made.name)
            tools.register(made)
            listed.add(made.name)
    for name in tools.names():
        if name.startswith(prefix) and name not in listed:
            tools.unregister(name)


def load() -> None:
    """At start: register the tools of each configured server from its last listing."""
    tools.add_finder(_find)
    if not settings.LOOP_MCP_SERVERS:
        return
    cached = _cached()
    for name, server in servers().items():
        if name in cached:
            _register_all(server, cached[name])


def discover_all() -> dict[str, str]:
    """List every server's tools now (the worker's start): an error by server name."""
    errors = {}
    for name, server in servers().items():
        try:
            discover(server)
        except (NotSent, TimeoutError) as exc:
            errors[name] = str(exc)
            log.warning("MCP server %s: %s", name, exc)
    return errors


def _pool() -> Pool:
    """The process's sessions (the SDK is loaded only by a process that calls a server)."""
    from .sessions import POOL

    return POOL


def close_sessions() -> None:
    """Close every MCP session this process holds (the worker's stop)."""
    import sys

    if "loop.mcp.sessions" in sys.modules:
        _pool().close()


_tried: dict[str, float] = {}  # server name -> when a name under it last made us list it
RETRY_LISTING_SECONDS = 30.0


def _find(name: str) -> None:
    """A name under `mcp.<server>.` the registry does not know: list that server (at most once
    every RETRY_LISTING_SECONDS)."""
    if not name.startswith(PREFIX) or not settings.LOOP_MCP_SERVERS:
        return
    server_name = name[len(PREFIX) :].split(".", 1)[0]
    server = servers().get(server_name)
    now = time.monotonic()
    if (
        server is None
        or now - _tried.get(server_name, -RETRY_LISTING_SECONDS) < RETRY_LISTING_SECONDS
    ):
        return
    _tried[server_name] = now
    try:
        discover(server)
    except (NotSent, TimeoutError) as exc:
        log.warning("MCP server %s: %s", server_name, exc)


# ---- one tool ------------------------------------------------------------------------------


def _tool(server: config.Server, spec: dict[str, Any]) -> tools.Tool:
    name = spec["name"]
    schema = spec.get("inputSchema") or {"type": "object"}
    if not isinstance(schema, dict):
        schema = {"type": "object"}
    decision = decide(server, name, spec.get("annotations") or {})
    full = f"{PREFIX}{server.name}.{name}"
    properties = schema.get("properties") or {}
    required = set(schema.get("required") or [])
    args = {
        arg: tools.Arg(
            type=TYPES.get(str(prop.get("type")), "any") if isinstance(prop, dict) else "any",
            required=arg in required,
        )
        for arg, prop in properties.items()
    }

    def check(values: dict[str, Any]) -> list[str]:
        if not tools.fixed(values):
            return []
        import jsonschema

        try:
            validator = jsonschema.validators.validator_for(schema)(schema)
            problems = sorted(validator.iter_errors(values), key=lambda e: list(e.path))
        except jsonschema.SchemaError as exc:
            return [f"the server's schema for '{full}' is broken: {exc.message}"]
        return [f"args.{'.'.join(map(str, e.path)) or '(all)'}: {e.message}" for e in problems]

    def describe(values: dict[str, Any]) -> tuple[str, str]:
        return f"mcp {server.name}", f"{name} {_short(values)}"

    def show(values: dict[str, Any]) -> list[shown.Field]:
        fields = [
            shown.Field("MCP server", f"{server.name} ({server.where})", "code"),
            shown.Field("tool", name, "code"),
        ]
        fields.extend(shown.value_field(arg, value) for arg, value in values.items())
        return fields

    def run_read(values: dict[str, Any]) -> dict[str, Any]:
        return vault.guarded(lambda: _read(values), _config_secrets(server))

    def run_effect(values: dict[str, Any], effect_id: str) -> dict[str, Any]:
        return vault.guarded(lambda: _effect(values, effect_id), _config_secrets(server))

    def _read(values: dict[str, Any]) -> dict[str, Any]:
        try:
            result = _pool().call(server, name, values)
        except (NotSent, Lost, TimeoutError) as exc:
            raise tools.TransientError(str(exc)) from None
        except Refused as exc:
            raise tools.ToolError(str(exc)) from None
        if result.is_error:
            raise tools.ToolError(f"{full} answered with an error: {_text(result)[:2000]}")
        return output(result)

    def _effect(values: dict[str, Any], effect_id: str) -> dict[str, Any]:
        try:
            result = _pool().call(server, name, values, key=effect_id)
        except NotSent as exc:
            raise EffectNotSent(str(exc)) from None
        except Refused as exc:
            raise EffectRejected(str(exc)) from None
        except (Lost, TimeoutError) as exc:
            raise EffectUncertainError(f"{full}: {exc}") from None
        if result.is_error:
            raise EffectRejected(f"{full} answered with an error: {_text(result)[:2000]}")
        return output(result)

    return tools.Tool(
        name=full,
        run=run_effect if decision.side_effect else run_read,
        args=args,
        side_effect=decision.side_effect,
        safe_to_repeat=decision.safe_to_repeat,
        describe=describe,
        show=show,
        check=check,
        description=str(spec.get("description") or "")[:2000],
        input_schema=schema,
    )


def _config_secrets(server: config.Server) -> dict[str, str]:
    """The secrets the server's env and headers name: kept out of what a call returns or
    raises (a server that echoes its Authorization header leaves no key in an output)."""
    try:
        return vault.resolve({**server.env, **server.headers})[1]
    except vault.SecretError:
        return {}


def output(result: types.CallToolResult) -> dict[str, Any]:
    """The result as an output and a receipt: its text, its structured content, whether the
    server marked it an error; bounded (`RESULT_CHARS`), saying so when cut."""
    text = _text(result)
    out: dict[str, Any] = {"text": tools.storable(text[:RESULT_CHARS])}
    if len(text) > RESULT_CHARS:
        out["truncated"] = len(text)
    if result.structured_content is not None:
        dumped = json.dumps(result.structured_content, default=str)
        if len(dumped) <= RESULT_CHARS:
            out["structured"] = json.loads(tools.storable(dumped))
        else:
            out["structured_truncated"] = len(dumped)
    out["is_error"] = bool(result.is_error)
    return out


def _text(result: types.CallToolResult) -> str:
    parts = []
    for block in result.content:
        if block.type == "text":
            parts.append(str(getattr(block, "text", "")))
        else:
            parts.append(f"[{block.type}]")
    return "\n".join(parts)


def _short(value: Any, limit: int = 200) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"
