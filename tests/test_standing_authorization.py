"""The standing authorization (DESIGN.md §10, §5), every branch through real `runloop`
processes on the test database: a scheduled run's tasks are not asked "May I do this?" while
the run's message is the conversation's latest, and a provably unsent cut of theirs runs again;
an earlier run's task, or any task once someone wrote since, is asked; an uncertain step is
always asked "Did this happen?"."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from loop import actions, plans, schedules
from loop.api.core import issue
from loop.models import Event, Message, Schedule, ScheduleRun, Step, Task
from loop.permissions import SYSTEM

from .conftest import manage, process_env, task_json
from .support.cuts import cut, intent_only, post, sent_not_recorded
from .support.sinks import Receiver

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as sink:
        yield sink


def scheduled(url: str, *, confirm_before: bool = True, name: str = "pay weekly") -> Schedule:
    """A schedule whose template pays `url`, due a minute ago."""
    plan = {
        "title": name,
        "schedule": "0 8 * * MON",
        "steps": [post(url, confirm_before=confirm_before)],
    }
    schedule = schedules.create(spec=plans.validate(plan), actor="dad", user=SYSTEM)
    Schedule.objects.filter(pk=schedule.pk).update(next_due=timezone.now() - timedelta(minutes=1))
    return schedule


def fire(schedule: Schedule) -> Task:
    """Make it due and fire it here, as a worker would: its next due time is next Monday."""
    Schedule.objects.filter(pk=schedule.pk).update(next_due=timezone.now() - timedelta(seconds=1))
    [run] = schedules.fire_due(actor="test")
    return Task.objects.get(origin_run=run)


def worker_once(**env: str) -> None:
    """A real worker: boot, fire what is due, one tick (one step), exit."""
    manage("runloop", "--once", env=process_env(**env))


def pay_step(task: Task) -> Step:
    return Step.objects.get(task=task, key="pay")


def passes(task: Task) -> list[dict[str, Any]]:
    return [e for e in task_json(task.pk)["events"] if e["kind"] == "side_effect_auto_confirmed"]


def test_the_current_runs_task_runs_without_asking_and_the_journal_says_why(
    receiver: Receiver, dad: User
) -> None:
    schedule = scheduled(receiver.url())
    worker_once()  # the worker fires the schedule, then runs the task's step
    run = ScheduleRun.objects.get(schedule=schedule)
    task = Task.objects.get(origin_run=run)
    shown = task_json(task.pk)
    assert shown["origin"] == {
        "kind": "schedule",
        "schedule": "pay weekly",
        "run": run.pk,
        "message": run.message_id,
    }
    [step] = shown["steps"]
    assert step["state"] == "done" and step["question"] is None
    assert len(receiver.posts) == 1
    [auto] = passes(task)
    assert auto["step"] == step["id"] and auto["actor"].startswith("worker:")
    assert auto["data"] == {"run": run.pk, "message": run.message_id, "rule": "confirm_before"}
    kinds = [e["kind"] for e in shown["events"]]
    assert kinds.index("side_effect_auto_confirmed") < kinds.index("step_started")
    client = Client()
    client.force_login(dad)
    page = client.get(f"/tasks/{task.pk}").content.decode()
    assert "Ran with the schedule's permission, without asking" in page
    assert f"(confirm_before, run {run.pk})" in page and "from schedule <strong" in page
    assert f"  from schedule pay weekly, message {run.message_id}" in manage("task", str(task.pk))
    said = json.loads(manage("conversation", "--json"))
    assert said == [
        {
            "id": run.message_id,
            "author": "schedule:pay weekly",
            "text": "[SCHEDULED TASK] pay weekly",
            "at": said[0]["at"],
        }
    ]


def test_an_earlier_runs_task_is_asked_while_the_current_runs_task_is_not(
    receiver: Receiver,
) -> None:
    schedule = scheduled(receiver.url())
    earlier, current = fire(schedule), fire(schedule)
    for _ in range(2):
        worker_once()
    assert pay_step(earlier).state == "blocked" and pay_step(earlier).question_kind == "may_i"
    assert pay_step(current).state == "done"
    assert len(receiver.posts) == 1
    assert passes(earlier) == [] and len(passes(current)) == 1


def dad_writes(how: str, dad: User) -> None:
    if how == "dashboard":
        client = Client()
        client.force_login(dad)
        response = client.post("/conversation", {"text": "wait, not this week"})
        assert response.status_code == 302
    elif how == "api":
        _, token = issue(name="dads-phone", user=dad)
        response = Client(HTTP_AUTHORIZATION=f"Bearer {token}").post(
            "/api/messages",
            json.dumps({"text": "wait, not this week"}),
            "application/json",
            headers={"Idempotency-Key": uuid.uuid4().hex},
        )
        assert response.status_code == 201, response.content
    else:
        manage("say", "wait, not this week", "--as", "dad")
    assert Message.objects.order_by("-id").first().text == "wait, not this week"  # type: ignore[union-attr]


@pytest.mark.parametrize("how", ["dashboard", "api", "say"])
def test_once_dad_writes_the_runs_task_is_asked(receiver: Receiver, dad: User, how: str) -> None:
    task = fire(scheduled(receiver.url()))
    dad_writes(how, dad)
    worker_once()
    pay = pay_step(task)
    assert pay.state == "blocked" and pay.question_kind == "may_i" and pay.attempts == 0
    assert receiver.posts == [] and passes(task) == []
    actions.unblock(step_id=pay.pk, decision="allow", actor="dad", user=dad)
    worker_once()
    assert pay_step(task).state == "done" and len(receiver.posts) == 1


def test_an_uncertain_effect_in_the_current_run_still_asks_did_this_happen(
    receiver: Receiver,
) -> None:
    task = fire(scheduled(receiver.url()))
    cut(task, sent_not_recorded)  # its first start ran under the pass; the post went out
    worker_once()
    pay = pay_step(task)
    assert pay.state == "blocked" and pay.question_kind == "did_it_happen"
    assert len(receiver.posts) == 1
    assert [p["data"]["rule"] for p in passes(task)] == ["confirm_before"]  # the first start only


def test_a_provably_unsent_cut_in_the_current_run_runs_again(receiver: Receiver) -> None:
    task = fire(scheduled(receiver.url(), confirm_before=False))
    cut(task, intent_only)
    worker_once(LOOP_RESUME_UNSENT="scheduled")
    assert pay_step(task).state == "done" and pay_step(task).attempts == 2
    assert len(receiver.posts) == 1
    [auto] = passes(task)
    assert auto["data"]["rule"] == "resume_unsent" and auto["data"]["run"] == task.origin_run_id


def test_a_provably_unsent_cut_after_dad_wrote_asks(receiver: Receiver, dad: User) -> None:
    task = fire(scheduled(receiver.url(), confirm_before=False))
    cut(task, intent_only)
    dad_writes("say", dad)
    worker_once(LOOP_RESUME_UNSENT="scheduled")
    pay = pay_step(task)
    assert pay.state == "blocked" and pay.question_kind == "may_i"
    assert "nothing was sent" in pay.question_text
    assert receiver.posts == [] and passes(task) == []


def test_a_task_not_from_a_schedule_never_has_a_pass(receiver: Receiver) -> None:
    """The latest message may be a run's, but a task from a plan file has no origin message."""
    fire(scheduled(receiver.url(), name="other"))
    plan = plans.validate(
        {"title": "by hand", "steps": [post(receiver.url(), confirm_before=True)]}
    )
    task = actions.create_task(plan=plan, actor="dad", user=SYSTEM)
    Task.objects.filter(origin_run__isnull=False).update(state="paused")  # only ours runs
    worker_once()
    assert pay_step(task).question_kind == "may_i" and receiver.posts == []
    assert Event.objects.filter(task=task, kind="side_effect_auto_confirmed").count() == 0
