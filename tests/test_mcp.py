"""Tools from MCP servers (DESIGN.md §18), against a real server written with the SDK's
`MCPServer` (tests/support/mcp_server.py), run as a real subprocess over stdio and over
streamable HTTP: read-only calls in tool and model steps, side-effect calls through the outbox
with the effect id in the request's _meta, Dad's decision of what is a side effect, a server
down as a retry, and a worker SIGKILLed mid-call asking "Did this happen?" naming the call."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from loop import actions, plans, tools
from loop.judges import prompt
from loop.mcp import catalog, config
from loop.mcp.sessions import POOL
from loop.models import Effect, Event, Step, Task
from loop.permissions import SYSTEM
from loop.worker import Worker

from .conftest import (
    ROOT,
    kill,
    make_task,
    process_env,
    run_until_idle,
    start_runloop,
    step,
    wait_for,
)
from .support.llm_server import briefings, call, commit, tool_results

SERVER = str(ROOT / "tests" / "support" / "mcp_server.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class HttpServer:
    """The test server over streamable HTTP, as a subprocess this test starts and kills."""

    def __init__(self, log: Path) -> None:
        self.port = free_port()
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def start(self) -> HttpServer:
        env = {**process_env(), "MCP_LOG": str(self.log), "MCP_SLOW": "60"}
        self.proc = subprocess.Popen(
            [sys.executable, SERVER, "http", str(self.port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(self._listening, timeout=30)
        return self

    def _listening(self) -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", self.port)) == 0

    def stop(self) -> None:
        if self.proc is not None:
            kill(self.proc)  # type: ignore[arg-type]


def calls_logged(log: Path) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines()]


@pytest.fixture
def servers(tmp_path: Path, settings: Any) -> Iterator[Callable[..., Path]]:
    """`servers(**specs)` writes a LOOP_MCP_SERVERS file and points the loop at it; the tools
    it registered are forgotten, and the sessions closed, after the test."""

    catalog._cache_path().unlink(missing_ok=True)  # no listing left by another test

    def configure(**specs: dict[str, Any]) -> Path:
        path = tmp_path / "mcp.json"
        path.write_text(json.dumps({"servers": specs}))
        settings.LOOP_MCP_SERVERS = str(path)
        catalog._tried.clear()
        catalog.load()
        return path

    yield configure
    POOL.close()
    catalog._cache_path().unlink(missing_ok=True)
    catalog._tried.clear()
    for name in tools.names():
        if name.startswith("mcp."):
            tools.unregister(name)


def refusals(*steps: dict[str, Any]) -> str:
    with pytest.raises(plans.PlanError) as refused:
        plans.validate({"title": "t", "steps": list(steps)})
    return str(refused.value)


def stdio(log: Path, **fields: Any) -> dict[str, Any]:
    return {"command": [sys.executable, SERVER, "stdio"], "env": {"MCP_LOG": str(log)}, **fields}


# ---- the servers file -----------------------------------------------------------------------


@pytest.mark.sqlite_only
@pytest.mark.parametrize(
    ("text", "named"),
    [
        ('{"servers": {"a": {}}}', "servers.a: needs exactly one of 'command'"),
        ('{"servers": {"a": {"url": "ftp://x"}}}', "servers.a.url"),
        ('{"servers": {"a": {"command": ["x"], "read_only": "lookup"}}}', "servers.a.read_only"),
        ('{"servers": {"a": {"command": ["x"], "trusted": "yes"}}}', "servers.a.trusted"),
        ('{"servers": {"a": {"command": ["x"], "colour": 1}}}', "servers.a.colour: unknown"),
        ('{"servers": {"a b": {"command": ["x"]}}}', "servers.a b: a server's name"),
        ("servers:\n  a:\n    url: http://h/mcp\n    headers: {X: 1}", "servers.a.headers"),
        ("[1, 2", "neither JSON nor YAML"),
        ("[1, 2]", "'servers' must be an object"),
    ],
)
def test_the_servers_file_is_refused_naming_the_field(text: str, named: str) -> None:
    with pytest.raises(config.ConfigError, match=None) as refused:
        config.parse(text)
    assert named in str(refused.value)


@pytest.mark.sqlite_only
def test_a_yaml_file_reads_as_json_does_and_a_bad_file_stops_the_start(tmp_path: Path) -> None:
    good = "servers:\n  files:\n    url: https://h/mcp\n    headers: {Authorization: 'Bearer ${secret:T}'}\n    read_only: [ls]\n"
    parsed = config.parse(good)["files"]
    assert (parsed.url, parsed.read_only, parsed.transport) == ("https://h/mcp", {"ls"}, "http")
    bad = tmp_path / "bad.yaml"
    bad.write_text("servers:\n  x:\n    command: []\n")
    result = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "check"],
        env=process_env(LOOP_MCP_SERVERS=str(bad)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "servers.x.command: must name a program" in result.stderr


@pytest.mark.sqlite_only
def test_dad_decides_what_is_a_side_effect_and_annotations_count_only_when_trusted() -> None:
    plain = config.Server("s", command=("x",), read_only=frozenset({"ls"}))
    trusted = config.Server("s", command=("x",), trusted=True, safe_to_repeat=frozenset({"rm"}))
    says_read_only = {"readOnlyHint": True, "idempotentHint": True}
    assert not catalog.decide(plain, "ls", {}).side_effect
    assert catalog.decide(plain, "cat", says_read_only).side_effect  # not trusted: ignored
    assert not catalog.decide(plain, "cat", says_read_only).safe_to_repeat
    assert not catalog.decide(trusted, "cat", says_read_only).side_effect
    put = catalog.decide(trusted, "put", {"idempotentHint": True})
    assert put.side_effect and put.safe_to_repeat
    assert catalog.decide(trusted, "rm", {"destructiveHint": True}).safe_to_repeat  # Dad's list
    assert catalog.decide(trusted, "mv", {}).side_effect  # unmarked


# ---- tool steps and model steps over stdio -----------------------------------------------------


def test_tools_reach_plans_with_their_schemas_and_run_in_tool_steps(
    worker: Worker, servers: Callable[..., Path], tmp_path: Path
) -> None:
    log = tmp_path / "calls.log"
    servers(w=stdio(log, read_only=["lookup"]))
    # the plan is checked against the server's own schema, naming the field
    refused = refusals(step("a", "mcp.w.lookup", args={"city": 3}))
    assert "step 'a': 'city' must be string" in refused
    refused = refusals(step("a", "mcp.w.lookup", args={"city": "x", "when": 1}))
    assert "step 'a': tool 'mcp.w.lookup' takes no argument 'when'" in refused
    refused = refusals(step("a", "mcp.w.send", args={"to": "x", "text": "y"}, side_effect=False))
    assert "side_effect" in refused
    assert tools.get("mcp.w.lookup").description == "The weather in a city."
    briefing = "\n".join(prompt.plan_tools())  # what a planning step is told
    assert "- mcp.w.lookup: read-only; args: city (string) (The weather in a city.)" in briefing
    assert "- mcp.w.send: side effect; args: to (string), text (string)" in briefing
    task = make_task(
        step("weather", "mcp.w.lookup", args={"city": "Oslo"}),
        step("tell", "mcp.w.send", args={"to": "dad", "text": "${weather.text}"}, side_effect=True),
        step("nope", "mcp.w.fail", args={"why": "no such thing"}, side_effect=True),
    )
    run_until_idle(worker)
    weather, tell, nope = Step.objects.filter(task=task).order_by("position")
    assert weather.state == "done" and weather.output["text"] == "sunny in Oslo"
    assert tell.state == "done" and tell.output["text"] == "sent to dad"
    effect = Effect.objects.get(step=tell)
    assert (effect.state, effect.sends, effect.safe_to_repeat) == ("succeeded", 1, False)
    assert effect.response["text"] == "sent to dad"  # the CallToolResult, as its receipt
    assert effect.target == "mcp w"
    assert calls_logged(log) == [
        {"tool": "send", "args": {"to": "dad", "text": "sunny in Oslo"}, "key": effect.pk}
    ]
    # isError is the server's no: the effect and the step fail, nothing is asked
    assert nope.state == "failed" and "no such thing" in nope.error
    assert Effect.objects.get(step=nope).state == "failed"
    assert not Step.objects.filter(task=task).exclude(question_kind="").exists()


def test_a_model_step_lists_a_servers_tools_and_calls_a_read_only_one(
    llm: Any, worker: Worker, servers: Callable[..., Path], tmp_path: Path
) -> None:
    log = tmp_path / "calls.log"
    servers(w=stdio(log, read_only=["lookup"]))

    def script(body: dict[str, Any], n: int) -> Any:
        results = tool_results(body["messages"])
        now = [b for b in briefings(body["messages"]) if "Your step now: " in b][-1]
        telling = "Your step now: tell" in now
        if telling and not any("sent to" in r for r in results):
            return call("mcp_w_send", to="dad", text="sunny in Bergen")
        if telling:
            return commit(output="told")
        if not results:
            return call("mcp_w_lookup", city="Bergen")
        return commit(output={"weather": json.loads(results[-1])["text"]})

    model = llm(script)
    task = make_task(
        {"key": "ask", "judge": "model", "instructions": "Weather?", "tools": ["mcp.w.*"]},
        {
            "key": "tell",
            "judge": "model",
            "instructions": "Tell Dad.",
            "tools": ["mcp.w.send"],
            "side_effect": True,
        },
    )
    run_until_idle(worker)
    ask, tell = Step.objects.filter(task=task).order_by("position")
    assert ask.output == {"weather": "sunny in Bergen"}
    # a side-effect call of a model step goes through the outbox like a tool step's
    effect = Effect.objects.get(step=tell)
    assert (effect.state, effect.tool) == ("succeeded", "mcp.w.send")
    assert calls_logged(log) == [
        {"tool": "send", "args": {"to": "dad", "text": "sunny in Bergen"}, "key": effect.pk}
    ]
    offered = model.requests[0]["tools"]
    names = [t["function"]["name"] for t in offered]
    assert "mcp_w_lookup" in names and "mcp_w_send" not in names  # a read-only step
    lookup = next(t for t in offered if t["function"]["name"] == "mcp_w_lookup")
    assert lookup["function"]["parameters"]["properties"]["city"]["type"] == "string"
    assert "The weather in a city." in lookup["function"]["description"]


def test_may_i_shows_an_mcp_call_in_full_like_any_call(
    worker: Worker, servers: Callable[..., Path], tmp_path: Path
) -> None:
    log = tmp_path / "calls.log"
    servers(w=stdio(log))
    body = "line\n" * 60  # long: the page folds it, the question keeps it whole
    task = make_task(
        step("tell", "mcp.w.send", args={"to": "dad", "text": body}, confirm_before=True)
    )
    run_until_idle(worker)
    tell = Step.objects.get(task=task)
    assert tell.question_kind == "may_i" and not calls_logged(log)
    shown = actions_question(tell)
    assert "mcp.w.send" in shown and "MCP server: w (" in shown and "tool: send" in shown
    assert "to: dad" in shown and f"text: {body}" in shown  # every argument, whole
    actions.unblock(step_id=tell.pk, decision="allow", actor="dad", user=SYSTEM)
    run_until_idle(worker)
    assert Step.objects.get(task=task).state == "done" and len(calls_logged(log)) == 1


# ---- over HTTP: a server down, a worker killed mid-call ------------------------------------------


def test_a_server_down_is_the_steps_retry_and_the_session_comes_back(
    worker: Worker,
    servers: Callable[..., Path],
    tmp_path: Path,
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings.LOOP_RETRY_BASE_SECONDS = 0
    http = HttpServer(tmp_path / "calls.log").start()
    try:
        monkeypatch.setenv("PIPPA_SECRET_MCP_KEY", "s3cret-value")
        headers = {"X-Key": "${secret:MCP_KEY}"}  # from the secrets store
        servers(h={"url": http.url, "read_only": ["lookup"], "headers": headers, "timeout": 10})
        first = make_task(
            step("a", "mcp.h.lookup", args={"city": "Oslo"}),
            step("k", "mcp.h.echo_header", args={"name": "X-Key"}),
        )
        run_until_idle(worker)
        assert Step.objects.get(task=first, key="a").state == "done"
        # the server was sent the value; what it echoed is stored as the secret's name
        assert calls_logged(http.log)[-1]["args"]["value"] == "s3cret-value"
        assert Step.objects.get(task=first, key="k").output["text"] == "[secret MCP_KEY]"
        http.stop()  # killed mid-session: the worker's open session is dead
        down = make_task(
            step("b", "mcp.h.lookup", args={"city": "Rome"}),
            step("c", "mcp.h.send", args={"to": "x", "text": "hi"}, side_effect=True),
        )
        assert worker.tick()
        retried = Event.objects.filter(task=down, kind="step_retry").first()
        assert retried is not None and "can't open a session with MCP server 'h'" in str(
            retried.data
        )
        assert Step.objects.get(task=down, key="b").state != "failed"
        worker.worker.refresh_from_db()
        assert worker.worker.state == "running"  # no stopped tick
        http.start()  # the same address again
        run_until_idle(worker)
        assert [s.state for s in Step.objects.filter(task=down).order_by("position")] == [
            "done",
            "done",
        ]
        assert Effect.objects.get(task=down).sends == 1
    finally:
        http.stop()


@pytest.mark.slow
def test_a_worker_killed_mid_call_asks_did_this_happen_and_a_trusted_idempotent_call_is_resent(
    transactional_db: None,
    tmp_path: Path,
    processes: list[subprocess.Popen[bytes]],
    servers: Callable[..., Path],
) -> None:
    http = HttpServer(tmp_path / "calls.log").start()
    try:
        path = servers(h={"url": http.url, "trusted": True})
        env = process_env(LOOP_MCP_SERVERS=str(path), LOOP_IDLE_SLEEP_MS="20")
        send = step("tell", "mcp.h.send", args={"to": "dad", "text": "slow news"}, side_effect=True)
        put = step("set", "mcp.h.put", args={"name": "slow-x", "value": 7}, side_effect=True)
        task = make_task(send, put)
        doomed = start_runloop("--worker-id", "doomed", env=env)
        processes.append(doomed)
        wait_for(lambda: len(calls_logged(http.log)) == 1)  # the server sleeps in the call
        kill(doomed)
        processes.append(start_runloop("--worker-id", "fresh", env=env))
        tell = wait_for(
            lambda: Step.objects.filter(
                task=task, key="tell", question_kind="did_it_happen"
            ).first()
        )
        question = actions_question(tell)
        assert "mcp.h.send" in question and "dad" in question and "slow news" in question
        actions.unblock(step_id=tell.pk, decision="happened", actor="dad", user=SYSTEM, note="yes")
        # the second step: trusted and idempotent, so a cut is simply sent again
        wait_for(lambda: len(calls_logged(http.log)) == 2)
        kill(processes[-1])
        processes.append(start_runloop("--worker-id", "third", env=env))
        wait_for(lambda: Task.objects.get(pk=task.pk).state == "done", timeout=120)
        logged = calls_logged(http.log)
        sends = [c for c in logged if c["tool"] == "send"]
        puts = [c for c in logged if c["tool"] == "put"]
        assert len(sends) == 1  # "It happened": never sent again
        effect = Effect.objects.get(step__key="set", step__task=task)
        assert effect.safe_to_repeat and len(puts) >= 2
        assert {c["key"] for c in puts} == {effect.pk}  # the same key each time
        assert not Step.objects.filter(task=task, key="set").exclude(question_kind="").exists()
    finally:
        http.stop()


def actions_question(step: Step) -> str:
    from loop import questions

    found = questions.question(step, Effect.objects.filter(step=step))
    assert found is not None
    return "\n".join(
        line
        for r in found.requests
        for line in [r.tool, *(f"{f.label}: {f.text}" for f in r.fields)]
    )


# ---- the tools page ---------------------------------------------------------------------------


def test_the_tools_page_shows_claims_beside_dads_decision_and_tests_a_connection(
    dad: Any, guest: Any, servers: Callable[..., Path], tmp_path: Path
) -> None:
    from django.test import Client

    servers(w=stdio(tmp_path / "calls.log", read_only=["lookup"], safe_to_repeat=["put"]))
    assert Client().get("/tools").status_code == 302  # login first
    visitor = Client()
    visitor.force_login(guest)
    assert "Test connection" not in visitor.get("/tools").content.decode()
    assert visitor.post("/tools/w/test").status_code == 403
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(dad)
    page = browser.get("/tools").content.decode()
    assert "Test connection" in page
    assert browser.post("/tools/w/test").status_code == 403  # no CSRF token
    token = browser.cookies["csrftoken"].value
    tested = browser.post("/tools/w/test", {"csrfmiddlewaretoken": token}, follow=True)
    shown = tested.content.decode()
    assert "w: connected; 5 tools" in shown
    lookup = shown.split('id="tool-w-lookup"')[1].split("</tr>")[0]
    assert "readOnlyHint: yes" in lookup and "read-only" in lookup and "Dad&#x27;s list" in lookup
    send = shown.split('id="tool-w-send"')[1].split("</tr>")[0]
    assert "readOnlyHint: no" in send and "side effect: not marked otherwise" in send
    put = shown.split('id="tool-w-put"')[1].split("</tr>")[0]
    assert "idempotentHint: yes" in put and "safe to repeat" in put
