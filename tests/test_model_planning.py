"""Pippa plans, too (DESIGN.md §12): a task from a goal in words starts in `planning`; its
planning tick shows the model the goal and every tool a plan may use; the model writes the plan
with add_steps (validated like any plan, a refusal returned as an error result); then the task
runs, or with LOOP_CONFIRM_PLANS waits for Dad's one click. Driven by the scripted server of
tests/support/llm_server.py, through real `runloop` processes and real receivers."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import transaction
from django.test import Client
from django.urls import reverse

from loop import actions, goals, lease, transcript
from loop.api.core import issue
from loop.models import Event, EventKind, Step, StepState, Task, TaskState, TranscriptEntry
from loop.permissions import SYSTEM, Forbidden
from loop.worker import Worker

from .conftest import (
    ROOT,
    kill,
    make_task,
    manage,
    model_env,
    process_env,
    run_until_idle,
    start_runloop,
    step,
    wait_for,
)
from .support.llm_server import ModelServer, briefings, calls, commit, tool_results
from .support.sinks import Receiver

GOAL = "Tell the weather service that Berlin is sunny."


def now_step(body: dict[str, Any]) -> str:
    """The key of the step the request is about (from its latest briefing)."""
    for text in reversed(briefings(body["messages"])):
        for line in text.splitlines():
            if line.startswith("Your step now: "):
                return line.removeprefix("Your step now: ").split(":")[0]
    raise AssertionError("no briefing")


def the_plan(url: str) -> list[dict[str, Any]]:
    """What the model writes: a tool step, a model step that reads its output, and a tool
    step with a side effect that sends the model step's output."""
    return [
        {"key": "city", "title": "The city", "tool": "echo", "args": {"value": {"city": "Berlin"}}},
        {
            "key": "word",
            "title": "Say it",
            "judge": "model",
            "instructions": "Write one sentence about the city's weather.",
        },
        {
            "key": "send",
            "title": "Send it",
            "tool": "http.post",
            "args": {"url": url, "json": "${word}"},
            "side_effect": True,
        },
    ]


def planner(url: str) -> Any:
    """A scripted model: plans (add_steps, which ends the planning step), then performs
    `word`."""

    def script(body: dict[str, Any], n: int) -> Any:
        key = now_step(body)
        if key == goals.PLAN_KEY:
            assert not tool_results(body["messages"]), "add_steps ended the planning tick"
            return calls(("add_steps", {"steps": the_plan(url)}))
        assert key == "word"
        assert (
            'city: The city [done] output: {"value": {"city": "Berlin"}}'
            in (briefings(body["messages"])[-1])
        )
        return commit(output={"text": "Berlin is sunny."})

    return script


def journal(task: Task, kind: EventKind) -> list[Event]:
    return list(Event.objects.filter(task=task, kind=kind).order_by("id"))


def moves(task: Task) -> list[tuple[str, str, str]]:
    return [
        (e.data["old"], e.data["new"], e.data.get("reason", ""))
        for e in journal(task, EventKind.TASK_STATE)
    ]


# ---- through real runloop processes --------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_goal_planned_by_the_model_then_run_to_done(
    settings: Any, tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    with Receiver() as receiver, ModelServer(planner(receiver.url("/weather"))) as model:
        settings.LOOP_LLM_BASE_URL = model.base_url
        task = actions.create_task_from_goal(goal=GOAL, actor="dad", user=SYSTEM)
        assert task.state == TaskState.PLANNING and task.instructions == GOAL
        [plan] = task.steps.all()
        assert (plan.key, plan.position, plan.judge, plan.side_effect, plan.tools) == (
            "plan",
            0,
            "model",
            False,
            [],
        )
        # The seeds' older rule: a plan Pippa writes runs at once, its side effects too.
        env = model_env(model, LOOP_CONFIRM_PLANS="never")
        proc = start_runloop(env=env, log=tmp_path / "runloop.log")
        processes.append(proc)
        wait_for(lambda: Task.objects.get(pk=task.pk).state == TaskState.DONE, timeout=90)
        kill(proc)

        # the planning tick: the goal, every tool a plan may use, and the plan-step format
        first = model.requests[0]
        shown = briefings(first["messages"])[0]
        assert f"Goal:\n{GOAL}" in shown
        assert "Your step now: plan: Plan: Tell the weather service" in shown
        assert "- email.send: side effect; args: to (list of string), subject (string)" in shown
        assert "- http.get: read-only; args: url (string), headers? (object)" in shown
        assert "Call add_steps with every step the goal needs" in shown
        assert '"judge": "model"' in shown and "this step is done" in shown
        offered = model.tool_names(0)
        assert {"add_steps", "commit_step", "echo", "http_get"} <= set(offered)
        assert "http_post" not in offered and "email_send" not in offered

        assert len(model.requests) == 2  # add_steps ended the planning tick; `word` asked once
        [added] = transcript.entries(Task.objects.get(pk=task.pk).steps.get(key="plan"))[-1:]
        assert added.content == "added steps: city, word, send"
        steps = list(Task.objects.get(pk=task.pk).steps.order_by("position"))
        assert [(s.key, s.state) for s in steps] == [
            ("plan", "done"),
            ("city", "done"),
            ("word", "done"),
            ("send", "done"),
        ]
        assert steps[0].output == {"steps": ["city", "word", "send"]}
        # outputs flowed: the model step read `city`, and `send` posted the model's output
        [posted] = receiver.requests
        assert json.loads(posted.body) == {"text": "Berlin is sunny."}
        assert moves(task)[0] == ("planning", "running", "planned")
        for s in steps:
            assert transcript.unpaired(transcript.entries(s)) == []


@pytest.mark.django_db(transaction=True)
def test_with_confirm_plans_nothing_runs_before_dad_approves(
    settings: Any, tmp_path: Path, dad: User, processes: list[subprocess.Popen[bytes]]
) -> None:
    with Receiver() as receiver, ModelServer(planner(receiver.url("/weather"))) as model:
        settings.LOOP_LLM_BASE_URL = model.base_url
        task = actions.create_task_from_goal(goal=GOAL, actor="dad", user=SYSTEM)
        env = model_env(model, LOOP_CONFIRM_PLANS="true")
        proc = start_runloop(env=env, log=tmp_path / "runloop.log")
        processes.append(proc)
        wait_for(lambda: Task.objects.get(pk=task.pk).state == TaskState.PAUSED, timeout=90)
        # the worker goes on working (another task runs to done) and takes up nothing of it
        other = make_task(step("other", args={"value": 1}), title="other")
        wait_for(lambda: Task.objects.get(pk=other.pk).state == TaskState.DONE, timeout=60)
        task.refresh_from_db()
        assert task.state == TaskState.PAUSED
        assert goals.waits_for_approval(task)
        assert moves(task) == [("planning", "paused", goals.WAITING)]
        started = {e.step.key for e in journal(task, EventKind.STEP_STARTED)}
        assert started == {"plan"}
        assert receiver.requests == [] and len(model.requests) == 1
        assert list(task.steps.order_by("position").values_list("key", "state")) == [
            ("plan", "done"),
            ("city", "pending"),
            ("word", "pending"),
            ("send", "pending"),
        ]
        # resuming is not approving: one way to approve
        with pytest.raises(actions.Refused, match="approve the plan"):
            actions.resume(task_id=task.pk, actor="dad", user=dad)

        actions.approve_plan(task_id=task.pk, actor="dad", user=dad)
        # `send` posts what `word` wrote: Dad is asked again once its body is known.
        send = task.steps.get(key="send")
        wait_for(lambda: Step.objects.get(pk=send.pk).state == StepState.BLOCKED, timeout=90)
        assert "Berlin is sunny." in Step.objects.get(pk=send.pk).question_text
        assert receiver.requests == []
        actions.unblock(step_id=send.pk, decision="allow", actor="dad", user=dad)
        wait_for(lambda: Task.objects.get(pk=task.pk).state == TaskState.DONE, timeout=90)
        kill(proc)
    assert moves(task)[:2] == [
        ("planning", "paused", goals.WAITING),
        ("paused", "running", goals.APPROVED),
    ]
    assert [json.loads(r.body) for r in receiver.requests] == [{"text": "Berlin is sunny."}]
    with pytest.raises(actions.Refused, match="no plan of it waits for approval"):
        actions.approve_plan(task_id=task.pk, actor="dad", user=dad)


@pytest.mark.django_db(transaction=True)
def test_manage_plan_goal_prints_the_id_of_a_task_pippa_plans(settings: Any) -> None:
    with ModelServer(lambda body, n: commit()) as model:
        out = manage("plan", "--goal", "Water the plants.", env=model_env(model))
    task = Task.objects.get(pk=int(out.strip()))
    assert (task.state, task.instructions, task.title) == (
        TaskState.PLANNING,
        "Water the plants.",
        "Water the plants.",
    )
    assert list(task.steps.values_list("key", "judge")) == [("plan", "model")]
    refused = plan_command("--goal", "Water the plants.", LOOP_LLM_BASE_URL="")
    assert refused.returncode != 0 and "LOOP_LLM_BASE_URL" in refused.stderr
    both = plan_command("plan.yaml", "--goal", "x")
    assert both.returncode != 0 and "--goal" in both.stderr
    assert Task.objects.count() == 1


def plan_command(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "plan", *args],
        capture_output=True,
        text=True,
        env=process_env(**env),
        timeout=120,
    )


# ---- one worker in this process ------------------------------------------------------------


@pytest.mark.django_db
def test_a_refused_plan_comes_back_as_an_error_and_the_second_try_works(
    llm: Any, worker: Worker
) -> None:
    bad = [{"key": "mail", "tool": "email.send", "args": {"subject": "hi"}}]
    good = [{"key": "hello", "tool": "echo", "args": {"value": "hi"}}]

    def script(body: dict[str, Any], n: int) -> Any:
        if now_step(body) != goals.PLAN_KEY:
            raise AssertionError("only the planning step asks the model")
        results = tool_results(body["messages"])
        if not results:
            return calls(("add_steps", {"steps": bad}))
        assert len(results) == 1, "the accepted add_steps ended the planning tick"
        return calls(("add_steps", {"steps": good}))

    server = llm(script)
    task = actions.create_task_from_goal(goal="Say hi.", title="Hi", actor="dad", user=SYSTEM)
    run_until_idle(worker)
    task.refresh_from_db()
    assert task.state == TaskState.DONE and task.title == "Hi"
    assert len(server.requests) == 2
    [refused] = tool_results(server.requests[1]["messages"])
    assert refused.startswith("error: refused: step 'mail': ")
    assert "'to'" in refused
    plan = task.steps.get(key="plan")
    added = TranscriptEntry.objects.filter(step=plan, role="tool").order_by("seq").last()
    assert added is not None and added.content == "added steps: hello"
    assert plan.output == {"steps": ["hello"]}  # the plan it wrote
    assert list(task.steps.order_by("position").values_list("key", "state")) == [
        ("plan", "done"),
        ("hello", "done"),
    ]
    assert Event.objects.filter(
        task=task, kind=EventKind.MODEL_CALL_REFUSED, data__tool="add_steps"
    ).exists()


@pytest.mark.django_db
def test_a_plan_step_that_writes_no_plan_fails_the_task(llm: Any, worker: Worker) -> None:
    llm(lambda body, n: commit(output="nothing to do"))
    task = actions.create_task_from_goal(goal="Do nothing.", actor="dad", user=SYSTEM)
    run_until_idle(worker)
    task.refresh_from_db()
    assert task.state == TaskState.FAILED
    assert moves(task) == [("planning", "failed", goals.NO_PLAN)]


@pytest.mark.django_db
def test_a_failed_plan_step_fails_the_task(llm: Any, worker: Worker) -> None:
    def script(body: dict[str, Any], n: int) -> Any:
        # a reply that also commits ends with its verdict, not as a written plan
        return calls(
            ("add_steps", {"steps": [step("a", args={"value": 1})]}),
            ("commit_step", {"verdict": "failed", "error": "the goal makes no sense"}),
        )

    llm(script)
    task = actions.create_task_from_goal(goal="Square the circle.", actor="dad", user=SYSTEM)
    run_until_idle(worker)
    task.refresh_from_db()
    assert task.state == TaskState.FAILED
    assert moves(task) == [("planning", "failed", "the planning step failed")]
    assert task.steps.get(key="a").state == StepState.PENDING  # it never ran
    assert "the goal makes no sense" in task.steps.get(key="plan").error


@pytest.mark.django_db
def test_a_plan_step_that_asks_dad_waits_then_plans_with_his_answer(
    llm: Any, worker: Worker, dad: User
) -> None:
    def script(body: dict[str, Any], n: int) -> Any:
        shown = "\n".join(str(m["content"]) for m in body["messages"])
        if "Dad's answers" not in shown:
            return commit("blocked", question="Which city?")
        assert not tool_results(body["messages"])[1:], "add_steps ended the planning tick"
        assert "Paris" in shown
        return calls(("add_steps", {"steps": [step("say", args={"value": "sunny"})]}))

    llm(script)
    task = actions.create_task_from_goal(goal="Say the weather.", actor="dad", user=SYSTEM)
    run_until_idle(worker)
    task.refresh_from_db()
    plan = task.steps.get(key="plan")
    assert (task.state, plan.state) == (TaskState.BLOCKED, StepState.BLOCKED)
    assert "Which city?" in plan.question_text
    # still Pippa's planning: no pause, and it is not a plan waiting for approval
    with pytest.raises(actions.Refused, match="while Pippa plans it"):
        actions.pause(task_id=task.pk, actor="dad", user=dad)
    actions.unblock(step_id=plan.pk, decision="allow", note="Paris", actor="dad", user=dad)
    task.refresh_from_db()
    assert task.state == TaskState.PLANNING
    run_until_idle(worker)
    task.refresh_from_db()
    assert task.state == TaskState.DONE
    assert [m[:2] for m in moves(task)] == [
        ("planning", "blocked"),
        ("blocked", "planning"),
        ("planning", "running"),
        ("running", "done"),
    ]


@pytest.mark.django_db
def test_the_claim_takes_planning_tasks_first(llm: Any, worker: Worker) -> None:
    running = make_task(step("a"))
    planning = actions.create_task_from_goal(goal="Plan me.", actor="dad", user=SYSTEM)
    claimable = set(Task.objects.claimable().values_list("pk", flat=True))
    assert claimable == {running.pk, planning.pk}
    with transaction.atomic():
        [(first, _)] = lease.claim_many(99, 1)
    assert first == planning.pk


# ---- the API -------------------------------------------------------------------------------


class Agent:
    def __init__(self, token: str) -> None:
        self.client = Client(HTTP_AUTHORIZATION=f"Bearer {token}")

    def post(self, path: str, body: Any = None) -> Any:
        data = "" if body is None else json.dumps(body)
        headers = {"Idempotency-Key": uuid.uuid4().hex}
        return self.client.post(path, data, content_type="application/json", headers=headers)


@pytest.mark.django_db
def test_the_api_creates_a_task_from_a_goal_and_names_the_field_when_refused(
    settings: Any, dad: User
) -> None:
    _, token = issue(name="pippa", user=dad)
    agent = Agent(token)
    settings.LOOP_LLM_BASE_URL = ""
    refused = agent.post("/api/tasks", {"goal": "Plan a trip."})
    assert refused.status_code == 400 and "LOOP_LLM_BASE_URL" in refused.json()["error"]
    settings.LOOP_LLM_BASE_URL = "http://127.0.0.1:9/v1"
    steps = [{"key": "a", "tool": "echo", "args": {}}]
    for body, field in (
        ({"goal": "Plan a trip.", "steps": steps, "title": "t"}, "steps"),
        ({"title": "nothing"}, "steps"),
        ({"goal": "   "}, "goal"),
        ({"goal": 7}, "goal"),
        ({"goal": "x" * (goals.GOAL_CHARS + 1)}, "goal"),
        ({"goal": "Plan a trip.", "title": ""}, "title"),
    ):
        answer = agent.post("/api/tasks", body)
        assert answer.status_code == 400, body
        assert answer.json()["error"].startswith(f"{field}:"), answer.json()
    assert not Task.objects.exists()

    created = agent.post("/api/tasks", {"goal": "Plan a trip.\nTo Rome.", "title": "Trip"})
    assert created.status_code == 201
    task = created.json()
    assert (task["state"], task["title"]) == ("planning", "Trip")
    assert [s["key"] for s in task["steps"]] == ["plan"]
    assert Task.objects.get(pk=task["id"]).instructions == "Plan a trip.\nTo Rome."

    phone = Agent(issue(name="dads-phone", user=dad, answers=True)[1])  # Dad's own client
    early = phone.post(f"/api/tasks/{task['id']}/approve")
    assert early.status_code == 409 and "no plan of it waits" in early.json()["error"]


@pytest.mark.django_db
def test_the_api_approves_a_waiting_plan(
    llm: Any, worker: Worker, dad: User, settings: Any
) -> None:
    settings.LOOP_CONFIRM_PLANS = "always"
    llm(planner("http://127.0.0.1:9/weather"))
    task = actions.create_task_from_goal(goal=GOAL, actor="dad", user=SYSTEM)
    run_until_idle(worker)
    assert Task.objects.get(pk=task.pk).state == TaskState.PAUSED
    _, token = issue(name="dads-phone", user=dad, answers=True)
    approved = Agent(token).post(f"/api/tasks/{task.pk}/approve")
    assert approved.status_code == 200 and approved.json()["state"] == "running"
    assert moves(task)[-1] == ("paused", "running", goals.APPROVED)


# ---- the dashboard -------------------------------------------------------------------------


def logged_in(user: User, **kwargs: Any) -> Client:
    client = Client(**kwargs)
    client.force_login(user)
    return client


@pytest.mark.django_db
def test_the_new_task_page_takes_a_goal_and_names_the_field(settings: Any, dad: User) -> None:
    client = logged_in(dad)
    page = client.get(reverse("loop:new_task")).content.decode()
    assert 'name="goal"' in page and 'name="plan"' in page
    settings.LOOP_LLM_BASE_URL = ""
    refused = client.post(reverse("loop:new_task"), {"goal": "Plan a trip."})
    assert refused.status_code == 400
    assert "LOOP_LLM_BASE_URL" in refused.context["form"].errors["goal"][0]
    settings.LOOP_LLM_BASE_URL = "http://127.0.0.1:9/v1"
    plan = "title: t\nsteps: [{key: a, tool: echo, args: {value: 1}}]"
    for data in ({"goal": "Plan a trip.", "plan": plan}, {"goal": "", "plan": ""}):
        answer = client.post(reverse("loop:new_task"), data)
        assert answer.status_code == 400
        assert "goal" in answer.context["form"].errors
    assert not Task.objects.exists()
    created = client.post(reverse("loop:new_task"), {"goal": "Plan a trip."})
    task = Task.objects.get()
    assert created.status_code == 302 and created["Location"] == reverse(
        "loop:task", args=[task.pk]
    )
    assert (task.state, task.origin, task.instructions) == ("planning", "dashboard", "Plan a trip.")
    # a plan still works from the same page
    assert client.post(reverse("loop:new_task"), {"plan": plan}).status_code == 302


@pytest.mark.django_db
def test_dad_approves_the_plan_with_one_click(
    llm: Any, worker: Worker, dad: User, guest: User, settings: Any
) -> None:
    settings.LOOP_CONFIRM_PLANS = "always"
    llm(planner("http://127.0.0.1:9/weather"))
    task = actions.create_task_from_goal(goal=GOAL, actor="dad", user=SYSTEM)
    run_until_idle(worker)
    url = reverse("loop:approve", args=[task.pk])
    home = logged_in(dad).get(reverse("loop:home")).content.decode()
    assert "waits for your approval" in home and url in home
    # it is in "Needs you" too, counted with the questions
    assert f'id="plan-waits-{task.pk}"' in home and 'data-count="1"' in home
    page = logged_in(dad).get(reverse("loop:task", args=[task.pk])).content.decode()
    assert "Approve the plan" in page and url in page and "Resume</button>" not in page

    assert logged_in(dad).get(url).status_code == 405
    assert logged_in(dad, enforce_csrf_checks=True).post(url).status_code == 403
    assert logged_in(guest).post(url).status_code == 403
    with pytest.raises(Forbidden):
        actions.approve_plan(task_id=task.pk, actor="guest", user=guest)
    assert Event.objects.filter(kind="decision_refused", data__action="approve a plan").exists()
    assert Task.objects.get(pk=task.pk).state == TaskState.PAUSED

    done = logged_in(dad).post(url)
    assert done.status_code == 302
    assert Task.objects.get(pk=task.pk).state == TaskState.RUNNING
    assert moves(task)[-1] == ("paused", "running", goals.APPROVED)
    assert logged_in(dad).post(url).status_code == 409  # nothing waits any more
    assert (
        f'id="plan-waits-{task.pk}"'
        not in logged_in(dad).get(reverse("loop:home")).content.decode()
    )
    assert Step.objects.filter(task=task).count() == 4
