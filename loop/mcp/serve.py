"""Pippa Loop as an MCP server (DESIGN.md §18): what an outside agent needs — create a task from
a plan or a goal, read tasks, take the next step and commit its verdict, read and write the
conversation — as MCP tools, each one request to the HTTP API (loop/api/) made inside this
process through Django's own request handling, with the agent's bearer token.

So an MCP client has exactly the API's permissions, validation, refusals naming the field and
command receipts (each write carries an Idempotency-Key: the tool's `key`, or a fresh one), and
nothing here changes state itself: there is no second path.

    manage.py mcp_server          stdio; the token from PIPPA_AGENT_TOKEN
    /mcp                          streamable HTTP, the token from the request's Authorization
"""

from __future__ import annotations

import json
import uuid
from contextvars import ContextVar
from functools import partial
from typing import Any

import anyio
from django.conf import settings
from django.db import close_old_connections
from django.test import Client
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations

INSTRUCTIONS = (
    "Pippa Loop runs tasks step by step and keeps their side effects safe: every call that "
    "changes the world is recorded before it is made and asked about when it may have been "
    "cut. Create a task with a plan (title and steps) or a goal in words; take a step you "
    "drive with next_step and end it with commit_step; talk to Pippa in the conversation."
)
READ = ToolAnnotations(read_only_hint=True, open_world_hint=False)
WRITE = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False)

# The bearer token of the agent this call is for (stdio: the process's; HTTP: the request's).
token: ContextVar[str] = ContextVar("loop_mcp_token", default="")


def api(method: str, path: str, body: Any = None, *, key: str | None, bearer: str) -> Any:
    """One request to the loop's HTTP API as the agent `bearer`: its JSON answer, or
    ToolError with the API's own words (they name the field) and status."""
    close_old_connections()
    try:
        hosts = [h for h in settings.ALLOWED_HOSTS if h != "*" and not h.startswith(".")]
        headers = {"Authorization": f"Bearer {bearer}", "Host": (hosts or ["localhost"])[0]}
        client = Client(raise_request_exception=False, secure=settings.SECURE_SSL_REDIRECT)
        if method == "POST":
            headers["Idempotency-Key"] = key or f"mcp-{uuid.uuid4()}"
            sent = json.dumps(body or {})
            response = client.post(
                path, data=sent, content_type="application/json", headers=headers
            )
        else:
            response = client.get(path, headers=headers)
        try:
            answer = json.loads(response.content or b"null")
        except ValueError:
            answer = response.content.decode(errors="replace")
        if response.status_code >= 400:
            detail = answer.get("detail") if isinstance(answer, dict) else answer
            raise ToolError(f"{response.status_code}: {detail}")
        return answer
    finally:
        close_old_connections()


async def _call(
    ctx: Context, method: str, path: str, body: Any = None, key: str | None = None
) -> Any:
    """The API's answer to the agent this call is for: the process's token (stdio), else the
    HTTP request's own Authorization (checked already by `endpoint`, and by the API again)."""
    bearer = token.get()
    if not bearer:
        scheme, _, given = ((ctx.headers or {}).get("authorization") or "").partition(" ")
        bearer = given.strip() if scheme.lower() == "bearer" else ""
    if not bearer:
        raise ToolError("401: no agent token (PIPPA_AGENT_TOKEN, or Authorization: Bearer)")
    return await anyio.to_thread.run_sync(partial(api, method, path, body, key=key, bearer=bearer))


def build() -> MCPServer:
    server = MCPServer("pippa-loop", instructions=INSTRUCTIONS)

    @server.tool(annotations=WRITE)
    async def create_task(
        ctx: Context,
        title: str | None = None,
        steps: list[dict[str, Any]] | None = None,
        goal: str | None = None,
        key: str | None = None,
    ) -> Any:
        """Create a task: a plan (title and steps, as a plan file has them) or a goal in words
        that Pippa plans. `key`: a command id; the same key answers the same again."""
        body: dict[str, Any] = {"goal": goal} if goal is not None else {}
        if title is not None:
            body["title"] = title
        if steps is not None:
            body["steps"] = steps
        return await _call(ctx, "POST", "/api/tasks", body, key)

    @server.tool(annotations=READ)
    async def list_tasks(ctx: Context) -> Any:
        """The tasks this agent may see, newest first."""
        return await _call(ctx, "GET", "/api/tasks")

    @server.tool(annotations=READ)
    async def show_task(ctx: Context, task_id: int) -> Any:
        """One task with its steps, their states, outputs and questions."""
        return await _call(ctx, "GET", f"/api/tasks/{task_id}")

    @server.tool(annotations=WRITE)
    async def next_step(ctx: Context, task_id: int, key: str | None = None) -> Any:
        """Take the next step of a task given to this agent: the step and a lease token."""
        return await _call(ctx, "POST", f"/api/tasks/{task_id}/next", {}, key)

    @server.tool(annotations=WRITE)
    async def commit_step(
        ctx: Context,
        step_id: int,
        lease_token: str,
        verdict: str,
        output: Any = None,
        error: str = "",
        delay: float | None = None,
        release: bool = False,
        key: str | None = None,
    ) -> Any:
        """End the step you took with a verdict: done (with its output), failed, retry or
        blocked (error: why, or the question)."""
        body = {"lease_token": lease_token, "verdict": verdict, "output": output}
        body.update({"error": error, "release": release})
        if delay is not None:
            body["delay"] = delay
        return await _call(ctx, "POST", f"/api/steps/{step_id}/commit", body, key)

    @server.tool(annotations=READ)
    async def read_conversation(ctx: Context) -> Any:
        """The conversation with Pippa."""
        return await _call(ctx, "GET", "/api/messages")

    @server.tool(annotations=WRITE)
    async def post_message(ctx: Context, text: str, key: str | None = None) -> Any:
        """Say something in the conversation with Pippa."""
        return await _call(ctx, "POST", "/api/messages", {"text": text}, key)

    return server
