"""The model judge (DESIGN.md §12) driven by a scripted OpenAI-compatible server: a real HTTP
server on 127.0.0.1 answering from a script and recording every request (tests/llm_server.py),
with the real receivers of tests/sinks.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, connections

from loop import actions, transcript
from loop.models import (
    Effect,
    Event,
    EventKind,
    Step,
    StepState,
    Task,
    TaskState,
    TranscriptEntry,
)
from loop.worker import Worker

from .conftest import kill, make_task, process_env, run_until_idle, start_runloop, wait_for
from .support.llm_server import (
    ModelServer,
    Refuse,
    Slow,
    Status,
    briefings,
    call,
    calls,
    commit,
    say,
    tool_results,
)
from .support.sinks import Receiver

pytestmark = pytest.mark.django_db


def model_step(key: str, instructions: str, **fields: Any) -> dict[str, Any]:
    return {"key": key, "judge": "model", "instructions": instructions, **fields}


def now_step(body: dict[str, Any]) -> str:
    """The key of the step the request is about (from its latest briefing)."""
    for text in reversed(briefings(body["messages"])):
        for line in text.splitlines():
            if line.startswith("Your step now: "):
                return line.removeprefix("Your step now: ").split(":")[0]
    raise AssertionError("no briefing")


def assert_paired(step: Step) -> None:
    assert transcript.unpaired(transcript.entries(step)) == []


def test_three_model_steps_pass_their_outputs_on(llm: Any, worker: Worker) -> None:
    def script(body: dict[str, Any], n: int) -> Any:
        key = now_step(body)
        last = body["messages"][-1]
        if key == "fetch":
            if last["role"] == "user":
                return call("echo", value={"price": 42})
            return commit(output={"price": 42})
        if key == "double":
            assert 'fetch: fetch [done] output: {"price": 42}' in briefings(body["messages"])[-1]
            return commit(output={"total": 84})
        assert 'output: {"total": 84}' in briefings(body["messages"])[-1]
        return commit(output={"said": "84"})

    server = llm(script)
    task = make_task(
        model_step("fetch", "Find the price."),
        model_step("double", "Double the price."),
        model_step("tell", "Say the total."),
        title="prices",
    )
    run_until_idle(worker)
    task.refresh_from_db()
    assert task.state == TaskState.DONE
    outputs = [s.output for s in task.steps.order_by("position")]
    assert outputs == [{"price": 42}, {"total": 84}, {"said": "84"}]
    assert len(server.requests) == 4
    # what the model was shown: the step's instructions verbatim, and only read-only tools
    first = server.requests[0]
    assert "Instructions:\nFind the price." in briefings(first["messages"])[0]
    assert "echo" in server.tool_names(0) and "http_get" in server.tool_names(0)
    assert "http_post" not in server.tool_names(0) and "email_send" not in server.tool_names(0)
    assert tool_results(server.requests[1]["messages"]) == ['{"value": {"price": 42}}']
    for s in task.steps.all():
        assert_paired(s)
    # every entry is journaled with it: the live pages follow the journal
    journaled = Event.objects.filter(task=task, kind=EventKind.TRANSCRIPT_ENTRY)
    assert sorted((e.step_id, e.data["seq"]) for e in journaled) == sorted(
        TranscriptEntry.objects.filter(task=task).values_list("step_id", "seq")
    )
    assert {e.actor for e in journaled} == {worker.actor}


def test_the_model_revises_the_plan_with_add_steps(llm: Any, worker: Worker) -> None:
    def script(body: dict[str, Any], n: int) -> Any:
        key = now_step(body)
        last = body["messages"][-1]
        if key == "look":
            if not tool_results(body["messages"]):
                return calls(
                    ("add_steps", {"steps": [{"key": "bad", "tool": "nope"}]}),
                    ("add_steps", {"steps": [model_step("extra", "Say hello.")], "after": "look"}),
                )
            # add_steps ended the tick: the next attempt's briefing shows the revised plan
            assert last["role"] == "user" and "- extra: " in last["content"]
            assert "(attempt 2 of" in last["content"]
            return commit(output="planned")
        return commit(output="hello")

    server = llm(script)
    task = make_task(model_step("look", "Look, then plan."), model_step("end", "Finish."))
    run_until_idle(worker)
    task.refresh_from_db()
    assert task.state == TaskState.DONE
    assert list(task.steps.order_by("position").values_list("key", "state")) == [
        ("look", "done"),
        ("extra", "done"),
        ("end", "done"),
    ]
    refused, added = tool_results(server.requests[1]["messages"])
    assert refused.startswith("error: refused: step 'bad': unknown tool 'nope'")
    assert added == "added steps: extra"
    look = task.steps.get(key="look")
    assert look.attempts == 2 and look.output == "planned"
    [revised] = Event.objects.filter(step=look, kind=EventKind.STEP_RETRY)
    assert "the plan was revised (added extra)" in revised.data["error"]
    assert Event.objects.filter(kind=EventKind.MODEL_CALL_REFUSED, data__tool="add_steps").exists()
    assert Event.objects.filter(kind=EventKind.STEPS_ADDED, actor=worker.actor).exists()


def test_a_read_only_step_is_never_offered_nor_given_a_side_effect_tool(
    llm: Any, worker: Worker
) -> None:
    with Receiver() as receiver:
        server = llm(
            [
                calls(
                    ("http_post", {"url": receiver.url()}),
                    ("no_such_tool", {}),
                    ("echo", "{not json"),
                    ("echo", {"value": 1, "extra": 2}),
                ),
                commit(output="refused as it should be"),
            ]
        )
        task = make_task(model_step("peek", "Only look.", tools=["echo", "http.get"]))
        run_until_idle(worker)
        assert receiver.posts == []
    assert "http_post" not in server.tool_names(0)
    assert sorted(server.tool_names(0)) == ["add_steps", "commit_step", "echo", "http_get", "say"]
    results = tool_results(server.requests[1]["messages"])
    assert results[0] == "error: the tool 'http_post' is not offered to this step: nothing was run"
    assert results[1] == "error: there is no tool 'no_such_tool': nothing was run"
    assert results[2].startswith("error: the arguments are not JSON")
    assert results[3] == "error: step 'peek': tool 'echo' takes no argument 'extra'"
    assert Event.objects.filter(kind=EventKind.MODEL_CALL_REFUSED).count() == 4
    assert not Effect.objects.exists()
    step = task.steps.get()
    assert step.state == StepState.DONE
    assert_paired(step)


def test_a_model_that_never_commits_is_reminded_once_then_the_cap_fails_it(
    llm: Any, worker: Worker
) -> None:
    server = llm(lambda body, n: say("I am thinking about it."))
    task = make_task(model_step("dream", "Do it.", max_attempts=2))
    run_until_idle(worker)
    step = task.steps.get()
    assert step.state == StepState.FAILED
    assert step.error == (
        "gave up after 2 attempts: step 'dream': the model stopped without commit_step"
    )
    assert len(server.requests) == 4  # per attempt: asked, reminded, asked again
    reminders = [
        m
        for m in server.requests[1]["messages"]
        if m["role"] == "user" and "call commit_step" in m["content"]
    ]
    assert len(reminders) == 1
    assert_paired(step)


@pytest.mark.django_db(transaction=True)
def test_a_replys_read_only_results_commit_together_before_the_next_request(
    llm: Any, worker: Worker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DESIGN.md §12: the reply commits before its calls run, and their results before the next
    request: the three read-only results in one commit, not three."""
    order: list[str] = []
    visible: list[list[str]] = []

    def script(body: dict[str, Any], n: int) -> Any:
        order.append("request")
        if n == 0:
            return calls(*[("echo", {"value": v}) for v in (1, 2, 3)])
        try:  # this thread's own connection sees only what the worker committed
            results = TranscriptEntry.objects.filter(role=TranscriptEntry.Role.TOOL)
            visible.append(sorted(results.values_list("content", flat=True)))
        finally:
            connection.close()
        return commit(output="echoed")

    llm(script)
    wrapper = connections["default"]
    commit_once = wrapper.commit

    def counted() -> None:
        commit_once()
        order.append("commit")

    monkeypatch.setattr(wrapper, "commit", counted)
    task = make_task(model_step("m", "Echo three values."))
    run_until_idle(worker)
    step = task.steps.get()
    assert step.state == StepState.DONE
    assert visible == [[f'{{"value": {v}}}' for v in (1, 2, 3)]]
    first, second = [i for i, what in enumerate(order) if what == "request"]
    assert order[first + 1 : second] == ["commit", "commit"]  # the reply; the three results
    assert_paired(step)


def test_an_endpoint_that_fails_is_retried_without_burning_an_attempt(
    llm: Any, worker: Worker
) -> None:
    server = llm(
        [
            Status(500),
            Status(429, {"Retry-After": "1"}),
            Refuse(0.6),
            commit(output="made it"),
        ]
    )
    task = make_task(model_step("patient", "Wait for the model.", max_attempts=1))
    run_until_idle(worker)
    step = task.steps.get()
    assert (step.state, step.output, step.attempts) == (StepState.DONE, "made it", 1)
    retries = list(Event.objects.filter(kind=EventKind.MODEL_RETRY).order_by("id"))
    reasons = [e.data["reason"] for e in retries]
    assert reasons[0].startswith("the model endpoint answered 500")
    assert reasons[1].startswith("the model endpoint answered 429")
    assert retries[1].data["delay"] >= 1  # the Retry-After honoured
    assert any(r.startswith("connection failed") for r in reasons[2:])
    assert len(server.requests) >= 4


def test_an_endpoint_that_stays_down_parks_the_worker_and_fails_nothing(
    llm: Any, worker: Worker, settings: Any, client: Any
) -> None:
    from loop import llm as model_client

    settings.LOOP_LLM_RETRY_SECONDS = 1
    llm(lambda body, n: Status(503))
    task = make_task(model_step("down", "Try.", max_attempts=1))
    assert worker.tick()
    step = task.steps.get()
    assert (step.state, step.attempts) == (StepState.RUNNING, 0)  # the attempt given back
    assert "model endpoint down: the model endpoint answered 503" in step.error
    assert not worker.tick()  # parked: no new work
    assert worker.parked_reason.startswith("model endpoint down: ")
    answer = client.get("/healthz")
    assert answer.status_code == 503
    assert "model endpoint down" in answer.content.decode()
    model_client._mark_up()


def test_may_i_shows_the_models_exact_call_and_covers_only_that_call(
    llm: Any, worker: Worker, dad: Any
) -> None:
    from django.core import mail as outbox

    from loop import serialize

    letter = {"to": ["dad@example.com"], "subject": "Leak", "body": "The tap drips."}

    def script(body: dict[str, Any], n: int) -> Any:
        results = tool_results(body["messages"])
        if not results:
            return call("email_send", **letter)
        return commit(output={"sent": results[-1]})

    llm(script)
    task = make_task(
        model_step("tell", "Tell Dad.", tools=["email.send"], side_effect=True, confirm_before=True)
    )
    run_until_idle(worker)
    step = task.steps.get()
    assert step.state == StepState.BLOCKED and step.question_kind == "may_i"
    assert step.question_text == (
        "May I do this?\nemail.send → dad@example.com: subject 'Leak', 14 characters"
    )
    assert outbox.outbox == [] and not Effect.objects.exists()
    question = serialize.question_dict(step, [])
    assert question is not None and question["call"]["tool"] == "email.send"
    shown = {f["label"]: f["text"] for f in question["call"]["request_view"]}
    assert "dad@example.com" in json.dumps(shown) and "The tap drips." in json.dumps(shown)

    actions.unblock(step_id=step.pk, decision="allow", actor="dad", user=dad)
    run_until_idle(worker)
    step.refresh_from_db()
    assert step.state == StepState.DONE
    assert len(outbox.outbox) == 1 and outbox.outbox[0].subject == "Leak"
    assert Event.objects.filter(kind=EventKind.AUTHORIZATION_CONSUMED, step=step).count() == 1
    assert_paired(step)
    as_json = serialize.task_dict(task)
    said = as_json["steps"][0]["transcript"]
    assert [m["role"] for m in said] == [
        "system",
        "user",
        "assistant",
        "tool",
        "user",
        "assistant",
        "tool",
    ]
    assert said[2]["tool_calls"][0]["name"] == "email_send"
    assert said[3]["effect"]["state"] == "succeeded"
    assert as_json["tokens"]["prompt"] > 0
    assert as_json["tokens"] == as_json["steps"][0]["tokens"]


def test_dads_allow_covers_one_call_a_second_call_asks_again(
    llm: Any, worker: Worker, dad: Any
) -> None:
    def script(body: dict[str, Any], n: int) -> Any:
        results = tool_results(body["messages"])
        if len(results) == 0:
            return call("email_send", to=["a@example.com"], subject="One", body="1")
        if len(results) == 1:
            return call("email_send", to=["b@example.com"], subject="Two", body="2")
        return commit(output="both")

    llm(script)
    task = make_task(
        model_step(
            "two", "Mail twice.", tools=["email.send"], side_effect=True, confirm_before=True
        )
    )
    run_until_idle(worker)
    step = task.steps.get()
    assert "a@example.com: subject 'One'" in step.question_text
    actions.unblock(step_id=step.pk, decision="allow", actor="dad", user=dad)
    run_until_idle(worker)
    step.refresh_from_db()
    assert step.state == StepState.BLOCKED
    assert "b@example.com: subject 'Two'" in step.question_text
    assert Effect.objects.filter(step=step).count() == 1
    # Deny, with a reason (DESIGN.md §17): the reason is the call's result, Pippa goes on.
    actions.unblock(step_id=step.pk, decision="deny", actor="dad", user=dad, note="Not Bob.")
    step.refresh_from_db()
    assert step.state == StepState.PENDING
    run_until_idle(worker)
    step.refresh_from_db()
    assert (step.state, step.output) == (StepState.DONE, "both")
    assert Effect.objects.filter(step=step).count() == 1
    results = [e.content for e in transcript.entries(step) if e.role == "tool"]
    assert results[1] == f"{actions.DENIED} Not Bob."
    assert_paired(step)


def test_long_results_and_outputs_are_cut_with_a_note_never_silently(
    llm: Any, worker: Worker, settings: Any
) -> None:
    settings.LOOP_LLM_RESULT_CHARS = 40

    def script(body: dict[str, Any], n: int) -> Any:
        key = now_step(body)
        if key == "long" and not tool_results(body["messages"]):
            return call("echo", value="x" * 100)
        return commit(output="y" * 100 if key == "long" else "ok")

    server = llm(script)
    make_task(model_step("long", "Make it long."), model_step("next", "Read it."))
    run_until_idle(worker)
    [result] = tool_results(server.requests[1]["messages"])
    assert result == '{"value": "' + "x" * 29 + "\n[cut: 73 more characters]"
    briefing = briefings(server.requests[2]["messages"])[-1]
    assert "[done] output: " + "y" * 40 + "\n[cut: 60 more characters]" in briefing


def test_an_endpoint_that_refuses_the_request_burns_the_attempt_naming_the_status(
    llm: Any, worker: Worker
) -> None:
    llm(lambda body, n: Status(400))
    task = make_task(model_step("bad", "Try.", max_attempts=2))
    run_until_idle(worker)
    step = task.steps.get()
    assert step.state == StepState.FAILED
    assert step.error.startswith(
        "gave up after 2 attempts: step 'bad': the model endpoint answered 400"
    )


def test_the_model_asks_dad_a_question_and_hears_his_answer(
    llm: Any, worker: Worker, dad: Any
) -> None:
    def script(body: dict[str, Any], n: int) -> Any:
        said = body["messages"][1]["content"]  # what every request carries (prompt.context)
        if "allow: Use the blue one." in said and "Dad's answers" in said:
            return commit(output="blue")
        return commit("blocked", question="Which colour, red or blue?")

    llm(script)
    task = make_task(model_step("paint", "Paint the fence."))
    run_until_idle(worker)
    step = task.steps.get()
    assert step.state == StepState.BLOCKED and step.question_kind == "may_i"
    assert "Pippa asks: Which colour, red or blue?" in step.question_text
    actions.unblock(
        step_id=step.pk, decision="allow", actor="dad", user=dad, note="Use the blue one."
    )
    run_until_idle(worker)
    step.refresh_from_db()
    assert (step.state, step.output) == (StepState.DONE, "blue")
    assert_paired(step)


def test_a_model_request_that_times_out_is_retried_and_journaled(
    llm: Any, worker: Worker, settings: Any
) -> None:
    settings.LOOP_LLM_TIMEOUT_SECONDS = 0.5
    llm([Slow(2, commit(output="too late")), commit(output="in time")])
    task = make_task(model_step("slow", "Be quick.", max_attempts=1))
    run_until_idle(worker)
    step = task.steps.get()
    assert (step.state, step.output, step.attempts) == (StepState.DONE, "in time", 1)
    [retry] = Event.objects.filter(kind=EventKind.MODEL_RETRY)
    assert retry.data["reason"] == "timed out after 0.5s"


# ---- through a real runloop process ----------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_real_runloop_runs_model_steps_that_revise_the_plan_and_pass_outputs_on(
    settings: Any, tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    """One `runloop` process, a real HTTP receiver: `look` reads it and adds `peek` to the
    plan (add_steps ends its tick; its next attempt commits what it read); `peek`, read-only,
    calls http_post anyway and is refused, nothing sent; `send` posts `look`'s output."""
    with Receiver() as receiver:

        def script(body: dict[str, Any], n: int) -> Any:
            key, done = now_step(body), tool_results(body["messages"])
            if key == "look":
                if not done:
                    return calls(("http_get", {"url": receiver.url("/weather")}))
                if len(done) == 1:
                    return calls(("add_steps", {"steps": [PEEK], "after": "look"}))
                assert "- peek: " in briefings(body["messages"])[-1]  # the revised plan
                return commit(output=json.loads(done[0])["body"])
            if key == "peek":
                return calls(("http_post", {"url": receiver.url()})) if not done else commit()
            assert 'look: Look [done] output: {"hello": "world"}' in briefings(body["messages"])[-1]
            if not done:
                return calls(("http_post", {"url": receiver.url(), "json": {"hello": "world"}}))
            return commit(output="sent")

        PEEK = model_step("peek", "Only look.", title="Peek", tools=["echo"])
        with ModelServer(script) as model:
            settings.LOOP_LLM_BASE_URL = model.base_url
            task = make_task(
                model_step("look", "Read the weather.", title="Look", tools=["http.get"]),
                model_step("send", "Post what look read.", tools=["http.post"], side_effect=True),
            )
            env = process_env(LOOP_LLM_BASE_URL=model.base_url, LOOP_IDLE_SLEEP_MS="20")
            proc = start_runloop(env=env, log=tmp_path / "runloop.log")
            processes.append(proc)
            wait_for(lambda: Task.objects.get(pk=task.pk).state == TaskState.DONE, timeout=90)
            kill(proc)
            peek_offered = [
                model.tool_names(i)
                for i, body in enumerate(model.requests)
                if now_step(body) == "peek"
            ]
        [posted] = receiver.posts
    assert json.loads(posted.body) == {"hello": "world"}
    steps = list(Task.objects.get(pk=task.pk).steps.order_by("position"))
    assert [(s.key, s.state) for s in steps] == [
        ("look", "done"),
        ("peek", "done"),
        ("send", "done"),
    ]
    assert steps[0].output == {"hello": "world"} and steps[0].attempts == 2
    assert all("http_post" not in offered for offered in peek_offered)
    refused = TranscriptEntry.objects.filter(step=steps[1], role="tool").order_by("seq").first()
    assert refused is not None
    assert (
        refused.content
        == "error: the tool 'http_post' is not offered to this step: nothing was run"
    )
    assert not Effect.objects.filter(step=steps[1]).exists()
    for s in steps:
        assert_paired(s)
