"""The tools page: each MCP server the operator configured (LOOP_MCP_SERVERS), each of its
tools with what the server claims (its annotations) beside what Dad decided (read-only, safe to
repeat, or a side effect), and a "test connection" that lists the server's tools now."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET, require_POST

from ... import permissions
from ...mcp import catalog, config
from ...mcp.outcomes import NotSent
from .respond import answer


@dataclass
class ToolRow:
    name: str
    description: str
    args: list[str]
    decision: catalog.Decision


@dataclass
class ServerRow:
    server: config.Server
    tools: list[ToolRow] | None  # None: never listed


def rows() -> list[ServerRow]:
    cached = catalog.listings()
    found = []
    for name, server in sorted(catalog.servers().items()):
        listing = cached.get(name)
        tools = None
        if listing is not None:
            tools = [_row(server, spec) for spec in listing if isinstance(spec, dict)]
        found.append(ServerRow(server, tools))
    return found


def _row(server: config.Server, spec: dict[str, Any]) -> ToolRow:
    schema = spec.get("inputSchema") or {}
    required = set(schema.get("required") or [])
    args = [
        f"{arg}{'' if arg in required else '?'}: {(prop or {}).get('type', 'any')}"
        for arg, prop in (schema.get("properties") or {}).items()
    ]
    name = str(spec.get("name"))
    decision = catalog.decide(server, name, spec.get("annotations") or {})
    return ToolRow(name, str(spec.get("description") or ""), args, decision)


def may_test(request: HttpRequest) -> bool:
    return permissions.may(request.user, "answer questions")


@login_required
@require_GET
def tools_page(request: HttpRequest) -> HttpResponse:
    return _page(request)


def _page(request: HttpRequest, **extra: Any) -> HttpResponse:
    context = {"servers": rows(), "may_test": may_test(request), **extra}
    return render(request, "loop/tools.html", context)


@login_required
@require_POST
def test_connection(request: HttpRequest, name: str) -> HttpResponse:
    """List the server's tools now (it starts a stdio server, or connects to a URL): for
    someone who may answer questions."""
    if not may_test(request):
        return answer(request, "you may not test a connection", status=403, fallback="/tools")
    server = catalog.servers().get(name)
    if server is None:
        raise Http404(f"no MCP server '{name}'")
    try:
        listed = catalog.discover(server)
    except (NotSent, TimeoutError) as exc:  # what the test found: shown beside the server
        return _page(request, failed=name, failure=str(exc))
    words = ", ".join(t.name for t in listed) or "no tools"
    return answer(request, f"{name}: connected; {len(listed)} tools: {words}", fallback="/tools")
