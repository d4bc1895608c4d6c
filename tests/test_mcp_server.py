"""Pippa Loop as an MCP server (loop/mcp/serve.py): an MCP client from the SDK starts
`manage.py mcp_server` as a real subprocess over stdio and drives a task end to end — create
it from a plan, take each step with next_step, commit it — with the API's permissions, its
refusals naming the field, and its command receipts (the same key answers the same again)."""

from __future__ import annotations

import json
import sys
from typing import Any

import anyio
import pytest
from django.contrib.auth.models import User
from mcp import ClientSession, StdioServerParameters, stdio_client

from loop.api.core import issue
from loop.models import Event, Receipt, Task

from .conftest import ROOT, process_env, step


def answer(result: Any) -> Any:
    assert not result.is_error, result.content
    return json.loads(result.content[0].text)


def test_an_sdk_client_drives_a_task_through_manage_py_mcp_server(
    transactional_db: None, dad: User, guest: User
) -> None:
    _, token = issue(name="desk", user=dad)
    _, guest_token = issue(name="visitor", user=guest)

    def params(bearer: str) -> StdioServerParameters:
        env = process_env(PIPPA_AGENT_TOKEN=bearer)
        return StdioServerParameters(
            command=sys.executable, args=[str(ROOT / "manage.py"), "mcp_server"], env=env
        )

    async def drive() -> int:
        async with stdio_client(params(token)) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                names = {t.name for t in (await session.list_tools()).tools}
                assert {"create_task", "next_step", "commit_step", "read_conversation"} <= names
                bad = await session.call_tool("create_task", {"title": "t", "steps": []})
                assert (
                    bad.is_error and "400" in bad.content[0].text and "steps" in bad.content[0].text
                )
                plan = {"title": "from mcp", "steps": [step("a"), step("b")], "key": "k1"}
                task = answer(await session.call_tool("create_task", plan))
                again = answer(await session.call_tool("create_task", plan))
                assert again["id"] == task["id"]  # the same command id: one task
                for key in ("a", "b"):
                    taken = answer(await session.call_tool("next_step", {"task_id": task["id"]}))
                    assert taken["step"]["key"] == key
                    done = answer(
                        await session.call_tool(
                            "commit_step",
                            {
                                "step_id": taken["step"]["id"],
                                "lease_token": taken["lease_token"],
                                "verdict": "done",
                                "output": {"said": key},
                            },
                        )
                    )
                    assert done["step"]["state"] == "done"
                shown = answer(await session.call_tool("show_task", {"task_id": task["id"]}))
                assert shown["state"] == "done"
                said = await session.call_tool("post_message", {"text": "all done"})
                assert not said.is_error
                assert "all done" in json.dumps(
                    answer(await session.call_tool("read_conversation"))
                )
                return int(task["id"])

    async def as_guest() -> str:
        async with stdio_client(params(guest_token)) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                refused = await session.call_tool(
                    "create_task", {"title": "t", "steps": [step("a")]}
                )
                assert refused.is_error
                return str(refused.content[0].text)

    task_id = anyio.run(drive)
    task = Task.objects.get(pk=task_id)
    assert task.state == "done" and task.steps.count() == 2
    assert Event.objects.filter(task=task, kind="step_started").first().actor == "agent:desk"
    assert Receipt.objects.filter(command_id="k1").count() == 1
    assert "403: you may not create a task (loop.add_task)" in anyio.run(as_guest)
    assert Task.objects.count() == 1


pytestmark = pytest.mark.slow


def test_the_http_endpoint_takes_agent_tokens_and_answers_as_the_api(
    transactional_db: None, dad: User, processes: list[Any], tmp_path: Any
) -> None:
    import socket
    import subprocess

    import httpx2
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    from .conftest import wait_for

    _, token = issue(name="desk", user=dad)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    processes.append(
        subprocess.Popen(
            [str(ROOT / ".venv/bin/daphne"), "-b", "127.0.0.1", "-p", str(port)]
            + ["pippa_site.asgi:application"],
            cwd=ROOT,
            env=process_env(),
            stdout=open(tmp_path / "daphne.log", "ab"),  # noqa: SIM115
            stderr=subprocess.STDOUT,
        )
    )
    url = f"http://127.0.0.1:{port}/mcp"
    wait_for(lambda: socket.socket().connect_ex(("127.0.0.1", port)) == 0, timeout=30)
    refused = httpx2.post(url, json={}, headers={"Authorization": "Bearer wrong"})
    assert refused.status_code == 401 and "Authorization" in refused.json()["detail"]
    assert httpx2.post(url, json={}).status_code == 401

    async def drive() -> Any:
        headers = {"Authorization": f"Bearer {token}"}
        async with create_mcp_http_client(headers=headers) as client:
            async with streamable_http_client(url, http_client=client) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    plan = {"title": "over http", "steps": [step("a")], "key": "h1"}
                    task = answer(await session.call_tool("create_task", plan))
                    listed = answer(await session.call_tool("list_tasks"))
                    return task, listed

    task, listed = anyio.run(drive)
    assert task["title"] == "over http"
    assert f'"id": {task["id"]}' in json.dumps(listed)
    assert Receipt.objects.filter(command_id="h1", agent__name="desk").count() == 1
