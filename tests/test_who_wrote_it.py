"""Authority comes from a person (DESIGN.md §1, §5 "Who wrote it", invariant 13): Pippa and
agents propose, Dad disposes. Each case an attacker or a careful user tried on the loop as it
stood (issue 23), now holding — in process, through the scripted model server, the real
receiver and the API; the cases that need real `runloop` processes are in
test_who_wrote_it_processes.py."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from loop import actions, goals
from loop.api.core import issue
from loop.models import Effect, Event, EventKind, Step, StepState, Task, TaskState
from loop.permissions import SYSTEM, Forbidden, Pippa
from loop.serialize import task_dict
from loop.worker import Worker

from .conftest import ROOT, make_task, process_env, run_until_idle, step
from .support.llm_server import call, calls, commit, tool_results
from .support.sinks import Receiver
from .test_api import Agent

pytestmark = pytest.mark.django_db


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as sink:
        yield sink


def model_step(key: str, instructions: str, **fields: Any) -> dict[str, Any]:
    return {"key": key, "judge": "model", "instructions": instructions, **fields}


def pay(url: str, amount: int, **fields: Any) -> dict[str, Any]:
    return step("pay", "http.post", args={"url": url, "json": {"amount": amount}}, **fields)


def kinds(task: Task) -> list[str]:
    return list(Event.objects.filter(task=task).values_list("kind", flat=True))


def dad_says(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


# ---- Pippa's revisions wait for Dad ---------------------------------------------------------


def adds_a_payment(url: str, confirm_before: bool = False) -> Any:
    """A read-only model step that adds an http.post step (confirm_before false), then ends."""

    def script(body: dict[str, Any], n: int) -> Any:
        if not tool_results(body["messages"]):
            return call("add_steps", steps=[pay(url, 5000, confirm_before=confirm_before)])
        return commit(output="planned")

    return script


def test_a_read_only_model_steps_add_steps_waits_for_dad_before_the_post_goes_out(
    llm: Any, worker: Worker, receiver: Receiver, dad: User
) -> None:
    llm(adds_a_payment(receiver.url()))
    task = make_task(model_step("look", "Look around."), title="look")
    run_until_idle(worker)
    task.refresh_from_db()
    added = task.steps.get(key="pay")
    assert task.state == TaskState.PAUSED and goals.waits_for_approval(task)
    assert (added.writer, added.proposed, added.state) == ("pippa", True, "pending")
    assert added.written_by == "Pippa (step 'look', attempt 1)"
    assert receiver.posts == []
    # What Dad approves: every side-effect call in full, on the home page's card.
    page = dad_says(dad).get("/").content.decode()
    assert "May I change the plan?" in page and "Pippa added steps to" in page
    assert receiver.url() in page and "5000" in page

    actions.approve_plan(task_id=task.pk, actor="dad", user=dad)
    run_until_idle(worker)
    task.refresh_from_db()
    assert task.state == TaskState.DONE
    assert [p.json for p in receiver.posts] == [{"amount": 5000}]
    [approved] = Event.objects.filter(task=task, kind=EventKind.PLAN_APPROVED)
    consumed = Event.objects.get(task=task, kind=EventKind.AUTHORIZATION_CONSUMED)
    assert consumed.data["call"] == approved.data["calls"]["pay"]


@pytest.mark.parametrize(
    "confirm_side_effects, confirm_plans", [(True, "side_effects"), (False, "always")]
)
def test_no_setting_lets_pippas_post_out_unasked(
    llm: Any,
    worker: Worker,
    receiver: Receiver,
    settings: Any,
    confirm_side_effects: bool,
    confirm_plans: str,
) -> None:
    """The plan's `confirm_before: false` does not lower LOOP_CONFIRM_SIDE_EFFECTS, and a plan
    Pippa wrote waits whatever she marks it."""
    settings.LOOP_CONFIRM_SIDE_EFFECTS = confirm_side_effects
    settings.LOOP_CONFIRM_PLANS = confirm_plans
    llm(adds_a_payment(receiver.url()))
    task = make_task(model_step("look", "Look around."))
    run_until_idle(worker)
    assert Task.objects.get(pk=task.pk).state == TaskState.PAUSED
    assert receiver.posts == []


def test_a_revision_dad_declines_never_runs_and_the_task_goes_on(
    llm: Any, worker: Worker, receiver: Receiver, dad: User
) -> None:
    llm(adds_a_payment(receiver.url()))
    task = make_task(model_step("look", "Look around."), step("after"))
    run_until_idle(worker)
    actions.decline_plan(task_id=task.pk, actor="dad", user=dad, note="not today")
    run_until_idle(worker)
    task.refresh_from_db()
    assert task.state == TaskState.DONE
    added = task.steps.get(key="pay")
    assert (added.state, added.waived, added.error) == (
        "failed",
        True,
        "declined by dad: not today",
    )
    assert receiver.posts == []


def test_with_never_pippas_side_effects_run_as_the_seeds_had_it(
    llm: Any, worker: Worker, receiver: Receiver, settings: Any
) -> None:
    settings.LOOP_CONFIRM_PLANS = "never"
    llm(adds_a_payment(receiver.url()))
    task = make_task(model_step("look", "Look around."))
    run_until_idle(worker)
    assert Task.objects.get(pk=task.pk).state == TaskState.DONE
    assert len(receiver.posts) == 1


def test_a_read_only_revision_runs_at_once_under_side_effects(llm: Any, worker: Worker) -> None:
    def script(body: dict[str, Any], n: int) -> Any:
        if not tool_results(body["messages"]):
            return call("add_steps", steps=[step("echoed")])
        return commit(output="planned")

    llm(script)
    task = make_task(model_step("look", "Look around."))
    run_until_idle(worker)
    task.refresh_from_db()
    assert task.state == TaskState.DONE
    assert task.steps.get(key="echoed").writer == "pippa"


def test_a_goal_with_a_payment_waits_for_dad(
    llm: Any, worker: Worker, receiver: Receiver, dad: User
) -> None:
    """`plan --goal "Pay the plumber 5000"` with the defaults: Pippa's plan waits."""

    def script(body: dict[str, Any], n: int) -> Any:
        if not tool_results(body["messages"]):
            return call("add_steps", steps=[pay(receiver.url(), 5000)])
        raise AssertionError("the planning step ends when its plan is taken")

    llm(script)
    task = actions.create_task_from_goal(goal="Pay the plumber 5000", actor="dad", user=dad)
    run_until_idle(worker)
    task.refresh_from_db()
    assert task.state == TaskState.PAUSED and goals.waits_for_approval(task)
    assert "May I run this plan?" in dad_says(dad).get("/").content.decode()
    assert receiver.posts == []
    actions.approve_plan(task_id=task.pk, actor="dad", user=dad)
    run_until_idle(worker)
    assert [p.json for p in receiver.posts] == [{"amount": 5000}]


def test_an_edit_after_approval_asks_again(
    llm: Any, worker: Worker, receiver: Receiver, dad: User
) -> None:
    llm(adds_a_payment(receiver.url()))
    task = make_task(model_step("look", "Look around."))
    run_until_idle(worker)
    actions.approve_plan(task_id=task.pk, actor="dad", user=dad)
    added = Step.objects.get(task=task, key="pay")
    actions.edit_steps(
        task_id=task.pk,
        edits={added.pk: {"args": {"url": receiver.url(), "json": {"amount": 9}}}},
        actor="pippa-agent",
        user=SYSTEM,
    )
    run_until_idle(worker)
    added.refresh_from_db()
    assert added.state == StepState.BLOCKED and added.question_kind == "may_i"
    assert '"amount": 9' in added.question_text and receiver.posts == []


# ---- the standing authorization covers Dad's template only --------------------------------


def test_the_standing_authorization_never_covers_a_step_pippa_added(
    llm: Any, worker: Worker, receiver: Receiver
) -> None:
    from loop import schedules

    llm(adds_a_payment(receiver.url(), confirm_before=True))
    spec = actions.plans.validate(
        {
            "title": "look",
            "schedule": "*/5 * * * *",
            "steps": [model_step("look", "Look around.")],
        }
    )
    schedule = schedules.create(spec=spec, actor="dad", user=SYSTEM)
    run = schedules.fire(schedule_id=schedule.pk, actor="test", now=schedule.next_due)
    assert run is not None
    run_until_idle(worker)
    task = Task.objects.get(origin_run=run)
    assert task.state == TaskState.PAUSED and receiver.posts == []
    assert EventKind.SIDE_EFFECT_AUTO_CONFIRMED not in kinds(task)
    assert task.steps.get(key="look").writer == "schedule"


# ---- effect ids: the installation, the call ---------------------------------------------------


def test_a_model_repeating_a_call_in_its_next_attempt_is_answered_from_the_receipt(
    llm: Any, worker: Worker, receiver: Receiver, dad: User
) -> None:
    """Seed 004: "the model usually verifies by doing it again". Its second identical call is
    the same effect: not sent, and the model is told when it happened and what it answered.
    Made a third time, after being told, it asks Dad "May I do this again?", showing the
    earlier one; his "allow" sends it once more, under a new key."""
    post = ("http_post", {"url": receiver.url(), "json": {"amount": 5}})

    def script(body: dict[str, Any], n: int) -> Any:
        said = tool_results(body["messages"])
        if len(said) < 3:
            return calls(post)  # the call, then the same again, then once more
        return commit(output={"paid": True})

    server = llm(script)
    task = make_task(
        model_step("pay", "Pay 5.", tools=["http.post"], side_effect=True), title="pay"
    )
    run_until_idle(worker)
    paying = Step.objects.get(task=task)
    assert len(receiver.posts) == 1
    assert paying.state == StepState.BLOCKED
    assert paying.question_text.startswith("May I do this again?")
    [effect] = Effect.objects.filter(step=paying)
    answered = tool_results(server.last_messages())
    assert answered[1].startswith("not sent again: this exact call already happened at ")
    assert '"received"' in answered[1]
    card = dad_says(dad).get("/").content.decode()
    assert "This exact call already happened at" in card

    actions.unblock(step_id=paying.pk, decision="allow", actor="dad", user=dad)
    run_until_idle(worker)
    assert Step.objects.get(pk=paying.pk).state == StepState.DONE
    assert [p.json for p in receiver.posts] == [{"amount": 5}] * 2
    assert len({p.key for p in receiver.posts}) == 2
    assert sorted(Effect.objects.filter(step=paying).values_list("again", flat=True)) == [0, 1]


def test_effect_ids_hold_the_installation_and_the_call_not_the_reply(
    llm: Any, worker: Worker, receiver: Receiver
) -> None:
    from loop import effects, installation

    post = ("http_post", {"url": receiver.url(), "json": {"amount": 4}})
    llm(lambda body, n: commit(output="ok") if tool_results(body["messages"]) else calls(post))
    task = make_task(model_step("pay", "Pay 4.", tools=["http.post"], side_effect=True))
    run_until_idle(worker)
    [effect] = Effect.objects.filter(task=task)
    step_row = Step.objects.get(task=task)
    assert effect.pk == effects.effect_id(step_row, "http.post", post[1], 0)
    assert receiver.posts[0].key == effect.pk
    # Another installation (another database's secret) gives the same call another id.
    mine = installation.secret()
    try:
        installation._known[next(iter(installation._known))] = "another database"
        assert effects.effect_id(step_row, "http.post", post[1], 0) != effect.pk
    finally:
        installation._known.clear()
    assert installation.secret() == mine


# ---- agents: their own keys, their own tasks, never an answer ---------------------------------


@pytest.fixture
def kidbot(dad: User) -> Agent:
    """An agent bound to Dad's user: his permissions, but not his voice."""
    return Agent(issue(name="kidbot", user=dad)[1])


@pytest.fixture
def dads_phone(dad: User) -> Agent:
    """Dad's own client: a token made to answer for him (`agent_token --answers`)."""
    return Agent(issue(name="dads-phone", user=dad, answers=True)[1])


def test_an_agents_plan_waits_and_only_a_person_approves_it(
    kidbot: Agent, dads_phone: Agent, receiver: Receiver, worker: Worker
) -> None:
    made = kidbot.post("/api/tasks", {"title": "pay", "steps": [pay(receiver.url(), 5)]})
    assert made.status_code == 201
    task = Task.objects.get(pk=made.json()["id"])
    assert made.json()["waits_for_approval"] and made.json()["driver"] == "kidbot"
    assert made.json()["steps"][0]["written_by"] == {"kind": "agent", "name": "kidbot"}
    refused = kidbot.post(f"/api/tasks/{task.pk}/approve")
    assert refused.status_code == 403
    assert "only a person may approve a plan" in refused.json()["detail"]
    assert Task.objects.get(pk=task.pk).state == TaskState.PAUSED
    assert dads_phone.post(f"/api/tasks/{task.pk}/approve").status_code == 200
    run_until_idle(worker)
    assert len(receiver.posts) == 1


def test_an_agent_never_answers_a_question_whatever_its_user(
    kidbot: Agent, dads_phone: Agent, receiver: Receiver, worker: Worker
) -> None:
    task = make_task(pay(receiver.url(), 5, confirm_before=True))
    run_until_idle(worker)
    asking = Step.objects.get(task=task)
    Task.objects.filter(pk=task.pk).update(driver="kidbot")
    refused = kidbot.post(f"/api/steps/{asking.pk}/unblock", {"decision": "allow"})
    assert refused.status_code == 403 and "only a person may answer" in refused.json()["detail"]
    assert Step.objects.get(pk=asking.pk).state == StepState.BLOCKED
    refusal = Event.objects.filter(task=task, kind=EventKind.DECISION_REFUSED).last()
    assert refusal is not None and refusal.actor == "agent:kidbot"
    answer = dads_phone.post(f"/api/steps/{asking.pk}/unblock", {"decision": "allow"})
    assert answer.status_code == 200


def test_pippa_answers_nothing(receiver: Receiver, worker: Worker) -> None:
    task = make_task(pay(receiver.url(), 5, confirm_before=True))
    run_until_idle(worker)
    asking = Step.objects.get(task=task)
    pippa = Pippa(task.pk, "pay", 1)
    with pytest.raises(Forbidden, match="Pippa may not answer questions"):
        actions.unblock(step_id=asking.pk, decision="allow", actor="worker:1", user=pippa)
    with pytest.raises(Forbidden, match="only in her own task"):
        actions.add_steps(task_id=task.pk + 1, steps=[step("x")], actor="w", user=pippa)


def test_an_agents_key_is_its_steps_and_binds_one_request(
    kidbot: Agent, receiver: Receiver, dad: User
) -> None:
    """Task 2 under the key task 1 used still sends its own POST; the same call under three
    keys (k1, k2, none) after one "Allow once" goes out once; a key reused for another
    request is a 409."""
    sent = []
    for amount in (1, 2):
        made = kidbot.post(
            "/api/tasks", {"title": f"pay {amount}", "steps": [pay(receiver.url(), amount)]}
        ).json()
        actions.approve_plan(task_id=made["id"], actor="dad", user=dad)
        taken = kidbot.post(f"/api/tasks/{made['id']}/next").json()
        held = {"lease_token": taken["lease_token"], "step": taken["step"]["id"]}
        the_call = {"tool": "http.post", "args": taken["step"]["args"]}
        for key in ("k1", "k2", None):
            body = {**held, **the_call, **({"key": key} if key else {})}
            answer = kidbot.post("/api/effects", body)
            assert answer.status_code == 200, answer.json()
            sent.append(answer.json()["effect"])
    assert [p.json for p in receiver.posts] == [{"amount": 1}, {"amount": 2}]
    assert len(set(sent)) == 2  # one effect per task, whatever the keys
    step_row = Step.objects.get(pk=held["step"])
    [effect] = step_row.effects.all()
    assert effect.key == "k1"
    other = {**held, "tool": "http.post", "args": {"url": receiver.url(), "json": {"amount": 9}}}
    # another request under k1: the step's call is bound first (409 naming the call)
    assert kidbot.post("/api/effects", {**other, "key": "k1"}).status_code == 409


def test_an_agent_drives_only_its_own_tasks(
    kidbot: Agent, receiver: Receiver, dad: User, worker: Worker
) -> None:
    """kidbot took Dad's task's `next`, committed a step with a made-up output, and Dad's POST
    paid the kid's wallet: now a 403 naming the rule, until a person gives the task."""
    task = make_task(step("quote", "sleep", args={"seconds": 0}), title="Dad's")
    assert task.driver == ""
    refused = kidbot.post(f"/api/tasks/{task.pk}/next")
    assert refused.status_code == 403 and "not agent 'kidbot''s" in refused.json()["detail"]
    assert kidbot.post(f"/api/tasks/{task.pk}/pause").status_code == 403
    actions.give(task_id=task.pk, agent="kidbot", actor="dad", user=dad)
    assert kidbot.post(f"/api/tasks/{task.pk}/next").status_code == 200
    assert task_dict(Task.objects.get(pk=task.pk))["driver"] == "kidbot"


# ---- who wrote it, wherever the step is shown -------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_every_step_says_who_wrote_it(
    llm: Any, worker: Worker, dad: User, kidbot: Agent, receiver: Receiver
) -> None:
    llm(adds_a_payment(receiver.url()))
    mine = make_task(model_step("look", "Look around."), actor="cli:root")
    run_until_idle(worker)
    shown = {s["key"]: s["written_by"] for s in task_dict(mine)["steps"]}
    assert shown == {
        "look": {"kind": "person", "name": "cli:root"},
        "pay": {"kind": "pippa", "name": "Pippa (step 'look', attempt 1)"},
    }
    page = dad_says(dad).get(f"/tasks/{mine.pk}").content.decode()
    assert "Pippa (step &#x27;look&#x27;, attempt 1)" in page and "proposed" in page
    [added] = Event.objects.filter(task=mine, kind=EventKind.STEPS_ADDED, data__proposed=True)
    assert added.data["written_by"]["kind"] == "pippa"
    staff = User.objects.create_superuser("staff", password="staff-password-1")
    admin = dad_says(staff).get(f"/admin/loop/task/{mine.pk}/change/").content.decode()
    assert "Pippa Pippa (step" in admin and "proposed: waits for approval" in admin
    out = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "task", str(mine.pk)],
        capture_output=True,
        text=True,
        env=process_env(),
        check=True,
    ).stdout
    assert "by pippa Pippa (step 'look', attempt 1)  proposed" in out


@pytest.mark.django_db(transaction=True)
def test_say_as_an_unknown_user_fails(dad: User) -> None:
    run = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "say", "hello", "--as", "nosuchuser"],
        capture_output=True,
        text=True,
        env=process_env(),
    )
    assert run.returncode != 0 and "--as: no user 'nosuchuser'" in run.stderr
    ok = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "say", "hello", "--as", "dad"],
        capture_output=True,
        text=True,
        env=process_env(),
    )
    assert ok.returncode == 0, ok.stderr


@pytest.mark.django_db(transaction=True)
def test_approve_at_the_shell(llm: Any, worker: Worker, receiver: Receiver) -> None:
    llm(adds_a_payment(receiver.url()))
    task = make_task(model_step("look", "Look around."))
    run_until_idle(worker)
    out = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "approve", str(task.pk)],
        capture_output=True,
        text=True,
        env=process_env(),
    )
    assert out.returncode == 0, out.stderr
    assert f"task {task.pk} is now running; approved:" in out.stdout
    assert f"pay: http.post → POST {receiver.url()}" in out.stdout
    assert '"amount": 5000' in out.stdout
    run_until_idle(worker)
    assert len(receiver.posts) == 1
