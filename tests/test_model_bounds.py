"""The model's bounds and bad replies (DESIGN.md §12 "Bounds", invariant 14): whatever the
endpoint answers is the model step's problem — a retry or a failed attempt naming why — never
the tick's, so the steps batched beside it keep their verdicts; a reply, a call's arguments,
the calls of a reply and a step's tokens have limits; every request says `max_tokens`; an
endpoint that is up but slow costs attempts, one that is down parks the worker, for at most
LOOP_LLM_GIVE_BACKS give-backs of a step."""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import pytest

from loop import transcript
from loop.judges import tool as tool_judge
from loop.models import Event, EventKind, Step, StepState, Task, TaskState
from loop.worker import Worker

from .conftest import make_task, run_until_idle, step
from .support.llm_server import Body, Raw, Slow, call, calls, commit, say, tool_results

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite_only]
# the model's bounds: database-independent, tried on the SQLite run


def model_step(key: str = "m", **fields: Any) -> dict[str, Any]:
    return {"key": key, "judge": "model", "instructions": "Do it.", **fields}


def beside(max_attempts: int = 1) -> tuple[Step, list[Step]]:
    """A model step (first claimed) and two plain echo steps of one attempt batched beside
    it: a tick that fails costs them theirs."""
    model = make_task(model_step(max_attempts=max_attempts), title="model").steps.get()
    plain = [
        make_task(step(f"plain{n}", max_attempts=1), title=f"plain {n}").steps.get()
        for n in range(2)
    ]
    return model, plain


def one_tick(worker: Worker, model: Step, plain: list[Step]) -> Step:
    """One tick of the batch: the plain steps done at their first attempt; the model step as
    the tick left it."""
    assert worker.tick()
    for one in plain:
        one.refresh_from_db()
        assert (one.state, one.attempts) == (StepState.DONE, 1), one.error
    model.refresh_from_db()
    return model


def assert_paired(one: Step) -> None:
    assert transcript.unpaired(transcript.entries(one)) == []


def completion(message: Any, usage: Any = None) -> dict[str, Any]:
    body: dict[str, Any] = {"choices": [{"index": 0, "message": message}]}
    if usage is not None:
        body["usage"] = usage
    return body


BAD_REPLIES = {
    "no choices": (Body({"choices": []}), 'the reply has no choices: {"choices": []}'),
    "an error in a 200": (Body({"error": {"message": "oops"}}), "the reply has no choices"),
    "a list": (Body([1, 2, 3]), "the reply has no choices: [1, 2, 3]"),
    "not JSON": (Raw(b"<html>502 Bad Gateway</html>", content_type="text/html"), "not JSON"),
    "not UTF-8": (Raw(b"\xff\xfe\x00\x01garbage"), "the reply is not JSON"),
    "nested too deep": (Raw(b"[" * 200_000), "the reply is not JSON"),
    "a number too long": (Raw(b"1" * 100_000), "the reply is not JSON"),
    "an empty body": (Raw(b""), "the reply is not JSON"),
    "no message": (Body({"choices": [{"text": "hi"}]}), "the reply's choice has no message"),
    "content not text": (
        Body(completion({"role": "assistant", "content": {"a": 1}})),
        "the reply's content is not text",
    ),
    "tool_calls not a list": (
        Body(completion({"content": None, "tool_calls": "echo"})),
        "the reply's tool_calls is not a list",
    ),
    "a call naming no function": (
        Body(completion({"content": None, "tool_calls": [{"id": "a", "type": "function"}]})),
        "the reply's tool call 1 names no function",
    ),
    "absurd usage": (
        Body(completion({"content": "hi"}, {"prompt_tokens": 1, "completion_tokens": 10**30})),
        f"the reply's usage.completion_tokens is {10**30}, not a count of tokens "
        f"(0 to {2**31 - 1})",
    ),
    "negative usage": (
        Body(completion({"content": "hi"}, {"prompt_tokens": -5})),
        "the reply's usage.prompt_tokens is -5, not a count",
    ),
    "NaN usage": (
        Body(completion({"content": "hi"}, {"prompt_tokens": float("nan")})),
        "the reply's usage.prompt_tokens is NaN, not a count",
    ),
    "usage as text": (
        Body(completion({"content": "hi"}, {"completion_tokens": "12"})),
        'the reply\'s usage.completion_tokens is "12", not a count',
    ),
}


@pytest.mark.parametrize("name", BAD_REPLIES)
def test_a_bad_reply_is_the_model_steps_failed_attempt_and_its_batch_keeps_its_verdicts(
    llm: Any, worker: Worker, name: str
) -> None:
    item, says = BAD_REPLIES[name]
    llm([item])
    model, plain = beside()
    model = one_tick(worker, model, plain)
    assert model.state == StepState.FAILED
    assert model.error.startswith("gave up after 1 attempt: step 'm': ")
    assert says in model.error
    [failed] = Event.objects.filter(step=model, kind=EventKind.STEP_FAILED)
    assert failed.data["error"] == model.error  # journaled
    # nothing of the bad reply was kept: the system message and the briefing only
    assert [e.role for e in transcript.entries(model)] == ["system", "user"]


def test_a_bad_reply_costs_an_attempt_and_the_next_goes_on(llm: Any, worker: Worker) -> None:
    server = llm([Body({"choices": []}), commit(output="second time")])
    task = make_task(model_step(max_attempts=2))
    run_until_idle(worker)
    one = task.steps.get()
    assert (one.state, one.output, one.attempts) == (StepState.DONE, "second time", 2)
    assert len(server.requests) == 2


def test_nul_and_lone_surrogates_are_stored_valid_and_the_change_is_said(
    llm: Any, worker: Worker
) -> None:
    server = llm(
        [
            calls(
                ("echo", '{"value": "a\x00b"}'),  # a NUL in the JSON text itself
                ("echo", '{"value": "a\\u0000b"}'),  # a NUL once parsed
                ("echo", '{"value": "\\ud800"}'),  # a lone surrogate once parsed
                ("e\udc80cho", {"value": 1}),
                text="look\x00ing \ud83d",
            ),
            commit(output="ok"),
        ]
    )
    model, plain = beside()
    model = one_tick(worker, model, plain)
    assert (model.state, model.output) == (StepState.DONE, "ok")
    reply = next(e for e in transcript.entries(model) if e.role == "assistant")
    assert reply.content == (
        "looking \ufffd\n[changed to be stored: content: 1 NUL character removed, "
        "1 surrogate UTF-8 cannot hold replaced; call 1's arguments: 1 NUL character removed; "
        "call 4's name: 1 surrogate UTF-8 cannot hold replaced]"
    )
    assert [c["name"] for c in reply.tool_calls] == ["echo", "echo", "echo", "e\ufffdcho"]
    [journaled] = Event.objects.filter(
        step=model, kind=EventKind.TRANSCRIPT_ENTRY, data__role="assistant"
    )[:1]
    assert "content: 1 NUL character removed" in journaled.data["changed"]
    results = tool_results(server.requests[1]["messages"])
    assert results[0] == '{"value": "ab"}'
    assert results[1] == ("error: arguments.value: a NUL character (\\u0000) can't be stored")
    assert results[2] == "error: arguments.value: a lone surrogate (\\ud800-\\udfff) is not text"
    assert results[3] == "error: there is no tool 'e\ufffdcho': nothing was run"
    assert_paired(model)


def test_commit_step_with_a_nul_in_its_error_is_refused_not_stored(
    llm: Any, worker: Worker
) -> None:
    server = llm(
        [
            calls(("commit_step", '{"verdict": "failed", "error": "bad\\u0000"}')),
            commit("failed", error="bad"),
        ]
    )
    task = make_task(model_step())
    run_until_idle(worker)
    one = task.steps.get()
    assert (one.state, one.error) == (StepState.FAILED, "step 'm': bad")
    assert tool_results(server.requests[1]["messages"]) == [
        "error: arguments.error: a NUL character (\\u0000) can't be stored"
    ]


# ---- the bounds -------------------------------------------------------------------------------


def test_every_request_says_max_tokens(llm: Any, worker: Worker, settings: Any) -> None:
    settings.LOOP_LLM_MAX_TOKENS = 321
    server = llm([call("echo", value=1), commit(output="ok")])
    task = make_task(model_step())
    run_until_idle(worker)
    assert task.steps.get().state == StepState.DONE
    assert [body["max_tokens"] for body in server.requests] == [321, 321]


def test_a_reply_over_the_size_limit_is_not_kept_and_costs_the_attempt(
    llm: Any, worker: Worker, settings: Any
) -> None:
    settings.LOOP_LLM_MAX_REPLY_BYTES = 4096
    llm([say("x" * 10_000)])
    model, plain = beside()
    model = one_tick(worker, model, plain)
    assert model.state == StepState.FAILED
    assert model.error == (
        "gave up after 1 attempt: step 'm': the reply is more than 4096 bytes "
        "(LOOP_LLM_MAX_REPLY_BYTES): not kept"
    )
    assert not any("xxxx" in e.content for e in transcript.entries(model))


def test_a_reply_cut_at_max_tokens_says_so(llm: Any, worker: Worker, settings: Any) -> None:
    settings.LOOP_LLM_MAX_TOKENS = 50
    server = llm([{"content": "I was saying", "finish_reason": "length"}, commit(output="ok")])
    make_task(model_step())
    run_until_idle(worker)
    said = server.requests[1]["messages"][-2]
    assert said["role"] == "assistant"
    assert said["content"] == (
        "I was saying\n[the endpoint cut this reply at LOOP_LLM_MAX_TOKENS (50)]"
    )


def test_arguments_over_the_limit_get_an_error_result_and_are_not_kept(
    llm: Any, worker: Worker, settings: Any
) -> None:
    settings.LOOP_LLM_MAX_ARG_BYTES = 100
    big = "é" * 200  # 400 bytes of UTF-8
    server = llm([calls(("echo", {"value": big}), ("echo", {"value": "small"})), commit()])
    task = make_task(model_step())
    run_until_idle(worker)
    one = task.steps.get()
    assert one.state == StepState.DONE
    size = len(json.dumps({"value": big}).encode())
    assert tool_results(server.requests[1]["messages"]) == [
        f"error: not run: its arguments are {size} bytes, more than LOOP_LLM_MAX_ARG_BYTES "
        "(100); they were not kept",
        '{"value": "small"}',
    ]
    reply = next(e for e in transcript.entries(one) if e.role == "assistant")
    assert reply.tool_calls[0]["arguments"] == "{}"
    assert "LOOP_LLM_MAX_ARG_BYTES" in reply.tool_calls[0]["refused"]
    assert big not in json.dumps(server.requests[1], ensure_ascii=False)  # never re-sent
    refused = Event.objects.get(step=one, kind=EventKind.MODEL_CALL_REFUSED)
    assert "LOOP_LLM_MAX_ARG_BYTES (100)" in refused.data["why"]
    assert_paired(one)


def test_calls_beyond_the_limit_each_get_an_error_result_and_only_the_first_run(
    llm: Any, worker: Worker, settings: Any
) -> None:
    settings.LOOP_LLM_MAX_CALLS = 3
    many = [("echo", {"value": n}) for n in range(10)]
    server = llm([calls(*many, ("commit_step", {"verdict": "done", "output": "sneaky"})), commit()])
    task = make_task(model_step())
    run_until_idle(worker)
    one = task.steps.get()
    # the commit_step past the limit was not run either: the step went on to the next reply
    assert (one.state, one.output) == (StepState.DONE, None)
    results = tool_results(server.requests[1]["messages"])
    assert results[:3] == ['{"value": 0}', '{"value": 1}', '{"value": 2}']
    surplus = (
        "error: not run: the reply made 11 calls, more than LOOP_LLM_MAX_CALLS (3); "
        "its arguments were not kept"
    )
    assert results[3:] == [surplus] * 8
    assert Event.objects.filter(step=one, kind=EventKind.MODEL_CALL_REFUSED).count() == 8
    assert_paired(one)


def test_a_step_over_its_token_budget_fails_naming_it(
    llm: Any, worker: Worker, settings: Any
) -> None:
    settings.LOOP_LLM_STEP_TOKENS = 100
    usage = {"prompt_tokens": 70, "completion_tokens": 40}
    server = llm(lambda body, n: {**call("echo", value=n), "usage": usage})
    task = make_task(model_step())
    run_until_idle(worker)
    one = task.steps.get()
    assert (one.state, one.attempts) == (StepState.FAILED, 1)
    assert one.error == (
        "step 'm': the step used 110 tokens, its budget LOOP_LLM_STEP_TOKENS (100): "
        "the model is asked no more"
    )
    assert len(server.requests) == 1
    assert_paired(one)  # the reply's call ran; nothing dangles
    assert Task.objects.get(pk=task.pk).state == TaskState.FAILED


# ---- slow, down -------------------------------------------------------------------------------


def test_an_endpoint_that_is_up_but_too_slow_costs_attempts_and_fails_the_step(
    llm: Any, worker: Worker, settings: Any
) -> None:
    """The livelock seen with a real server: every answer later than the timeout was taken
    for an outage, the attempt given back and the worker parked, at every tick, for ever."""
    settings.LOOP_LLM_TIMEOUT_SECONDS = 0.3
    server = llm(lambda body, n: Slow(1.5, commit(output="too late")))
    model, plain = beside(max_attempts=2)
    model = one_tick(worker, model, plain)
    assert (model.state, model.attempts) == (StepState.RUNNING, 1)  # counted
    assert worker.parked_reason == ""
    run_until_idle(worker)
    model.refresh_from_db()
    assert model.state == StepState.FAILED
    assert model.error == (
        "gave up after 2 attempts: step 'm': timed out after 0.3s, twice, from an endpoint "
        "that is up"
    )
    assert len(server.requests) == 4  # each attempt: asked, retried once
    retries = Event.objects.filter(step=model, kind=EventKind.MODEL_RETRY)
    assert [e.data["reason"] for e in retries] == ["timed out after 0.3s"] * 2
    assert not Event.objects.filter(kind=EventKind.WORKER_PARKED).exists()


def test_a_refused_connection_parks_the_worker_gives_the_attempt_back_then_fails_the_step(
    llm: Any, worker: Worker, settings: Any
) -> None:
    settings.LOOP_LLM_RETRY_SECONDS = 0.3
    settings.LOOP_LLM_GIVE_BACKS = 2
    model, plain = beside()  # the fixture points the loop at a port nobody answers
    model = one_tick(worker, model, plain)
    assert (model.state, model.attempts) == (StepState.RUNNING, 0)  # given back
    assert "model endpoint down: connection failed" in model.error
    assert not worker.tick()  # parked: no new work
    assert worker.parked_reason.startswith("model endpoint down: connection failed")
    for _ in range(50):
        worker.tick()
        model.refresh_from_db()
        if model.state == StepState.FAILED:
            break
        time.sleep(0.1)
    assert model.attempts == 1
    assert model.error.startswith("step 'm': model endpoint down: connection failed")
    assert model.error.endswith("(the attempt was given back 2 times, LOOP_LLM_GIVE_BACKS)")
    given = Event.objects.filter(step=model, kind=EventKind.STEP_RETRY, data__refund=True)
    assert given.count() == 2
    time.sleep(0.35)
    assert not worker.tick() and worker.parked_reason == ""  # the outage is over


def test_a_timeout_from_an_endpoint_that_answers_nothing_parks_and_does_not_count(
    llm: Any, worker: Worker, settings: Any
) -> None:
    """A host that takes connections and never answers, not even `GET /models`: down."""
    settings.LOOP_LLM_TIMEOUT_SECONDS = 0.3
    settings.LOOP_LLM_RETRY_SECONDS = 0.5
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        settings.LOOP_LLM_BASE_URL = f"http://127.0.0.1:{silent.getsockname()[1]}/v1"
        model, plain = beside()
        model = one_tick(worker, model, plain)
    assert (model.state, model.attempts) == (StepState.RUNNING, 0)
    assert model.error == "step 'm': model endpoint down: timed out after 0.3s"
    assert not worker.tick()
    assert worker.parked_reason == "model endpoint down: timed out after 0.3s"


# ---- any judge, any tool ----------------------------------------------------------------------


def test_a_model_judge_that_breaks_is_its_steps_retry_not_the_ticks(
    llm: Any, worker: Worker, monkeypatch: pytest.MonkeyPatch
) -> None:
    from loop import llm as client

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug in the model judge")

    monkeypatch.setattr(client, "complete", broken)
    model, plain = beside()
    model = one_tick(worker, model, plain)
    assert model.state == StepState.FAILED
    assert (
        model.error == "gave up after 1 attempt: step 'm': RuntimeError: a bug in the model judge"
    )


def test_a_tool_output_the_database_refuses_fails_its_step_not_the_batch(
    worker: Worker,
) -> None:
    bad = make_task(step("bad", "test.garbled", args={}, max_attempts=1)).steps.get()
    plain = [make_task(step(f"plain{n}", max_attempts=1)).steps.get() for n in range(2)]
    bad = one_tick(worker, bad, plain)
    assert bad.state == StepState.FAILED
    assert bad.error == (
        "step 'bad': its output can't be stored: output.text: a NUL character (\\u0000) "
        "can't be stored"
    )


@pytest.mark.django_db(transaction=True)  # test.seen_effect looks from another connection
def test_a_judge_that_breaks_on_a_batch_performs_each_step_alone(
    worker: Worker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Side-effect steps share one turn of their judge; when it breaks and which step broke
    it is not known, each is performed alone: only the one that breaks pays."""
    real = tool_judge.ToolJudge.perform

    def breaks_on_bomb(self: Any, turn: Any) -> Any:
        if any(work.step.key == "bomb" for work in turn):
            raise RuntimeError("boom")
        return real(self, turn)

    monkeypatch.setattr(tool_judge.ToolJudge, "perform", breaks_on_bomb)
    keys = ["e0", "bomb", "e1"]
    tasks = [make_task(step(k, "test.seen_effect", args={}, max_attempts=1), title=k) for k in keys]
    assert worker.tick()
    done = {t.steps.get().key: t.steps.get() for t in tasks}
    for key in ("e0", "e1"):
        assert (done[key].state, done[key].attempts) == (StepState.DONE, 1)
        # the three ran in one batch: each saw the others running
        assert done[key].output["running_side_effect"] == sorted(keys)
    assert done["bomb"].state == StepState.FAILED
    assert done["bomb"].error == "gave up after 1 attempt: step 'bomb': RuntimeError: boom"
