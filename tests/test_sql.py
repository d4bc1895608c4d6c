"""The hot statements of loop.sql read and write rows exactly as the ORM would, and follow the
models' own rules: what the claim takes is what `Task.objects.claimable()` finds, and each
task's first open step is the first of `Step.objects.open()`."""

from __future__ import annotations

from datetime import timedelta

from django.db import transaction
from django.forms.models import model_to_dict
from django.utils import timezone

from loop import lease, open_steps, sql
from loop.models import Effect, Step, StepState, Task, TaskState

from .conftest import make_task, step


def test_a_loaded_row_equals_the_orms(db: None) -> None:
    task = make_task(step("a", args={"value": {"nested": [1, "two", None]}}))
    Step.objects.filter(task=task).update(output={"x": 1.5}, started_at=timezone.now())
    orm = Step.objects.get(task=task)
    loaded = sql.load(Step, "task_id = %s", [task.pk])
    assert loaded is not None and model_to_dict(loaded) == model_to_dict(orm)
    assert sql.load(Step, "task_id = %s", [task.pk + 1000]) is None


def test_update_and_insert_write_what_the_orm_reads_back(db: None) -> None:
    task = make_task(step("a"))
    a = task.steps.get()
    later = timezone.now() + timedelta(minutes=5)
    with transaction.atomic():
        changed = sql.update(
            Step,
            {"output": {"ok": [True]}, "retry_at": later, "error": "", "attempts": 2},
            {"id": a.pk, "state": "pending", "finished_at": None},
        )
        assert changed == 1
        assert sql.update(Step, {"attempts": 3}, {"id": a.pk, "state": "done"}) == 0
        [intent] = sql.create_many(
            Effect,
            [
                {
                    "id": "e" * 64,
                    "task": task,
                    "step": a,
                    "tool": "http.post",
                    "request": {"json": [1, "two", None]},
                    "lease_until": later,
                }
            ],
        )
    a.refresh_from_db()
    assert (a.output, a.retry_at, a.attempts) == ({"ok": [True]}, later, 2)
    effect = Effect.objects.get(pk="e" * 64)
    assert model_to_dict(effect) == model_to_dict(intent)
    assert (effect.task_id, effect.step_id, effect.request, effect.lease_until) == (
        task.pk,
        a.pk,
        {"json": [1, "two", None]},
        later,
    )
    assert Task.objects.filter(pk=task.pk, lease_owner__isnull=True).exists()


def test_the_claim_takes_exactly_what_the_orm_calls_claimable(db: None) -> None:
    now = timezone.now()
    tasks = [make_task(step("a"), title=f"t{n}") for n in range(6)]
    Task.objects.update(state=TaskState.RUNNING)
    free, ran_out, held, waiting, due, paused = tasks
    Task.objects.filter(pk=ran_out.pk).update(lease_owner=7, lease_until=now - timedelta(1))
    Task.objects.filter(pk=held.pk).update(lease_owner=7, lease_until=now + timedelta(1))
    Task.objects.filter(pk=waiting.pk).update(run_after=now + timedelta(1))
    Task.objects.filter(pk=due.pk).update(run_after=now - timedelta(1))
    Task.objects.filter(pk=paused.pk).update(state=TaskState.PAUSED)
    claimable = set(Task.objects.claimable().values_list("pk", flat=True))
    assert claimable == {free.pk, ran_out.pk, due.pk}
    assert set(Task.objects.claimable().values_list("pk", flat=True)) == (claimable)
    with transaction.atomic():
        claimed = lease.claim_many(99, 10)
    assert {task_id for task_id, _ in claimed} == claimable
    assert not Task.objects.claimable().exists()
    # An agent's `next` takes a task it holds already, never one another holds.
    assert lease.claim_task(held.pk, 7, seconds=60) is not None
    assert lease.claim_task(held.pk, 8, seconds=60) is None
    assert lease.claim_task(waiting.pk, 8, seconds=60) is None


def test_first_open_is_the_first_of_step_objects_open(db: None) -> None:
    tasks = [make_task(*(step(f"s{n}") for n in range(5)), title=f"t{k}") for k in range(4)]
    states = [
        [StepState.DONE, StepState.FAILED, StepState.PENDING, StepState.PENDING, StepState.DONE],
        [StepState.DONE, StepState.BLOCKED, StepState.RUNNING, StepState.DONE, StepState.DONE],
        [StepState.DONE, StepState.DONE, StepState.FAILED, StepState.DONE, StepState.FAILED],
        [
            StepState.RUNNING,
            StepState.PENDING,
            StepState.PENDING,
            StepState.PENDING,
            StepState.DONE,
        ],
    ]
    for task, row in zip(tasks, states, strict=True):
        for n, state in enumerate(row):
            Step.objects.filter(task=task, key=f"s{n}").update(state=state)
    ids = [task.pk for task in tasks]
    found = open_steps.first_open(ids)
    expected = {
        task.pk: first
        for task in tasks
        if (first := Step.objects.filter(task=task).open().first()) is not None
    }
    assert {t: s.pk for t, s in found.items()} == {t: s.pk for t, s in expected.items()}
    assert {t: s.key for t, s in found.items()} == {
        tasks[0].pk: "s2",
        tasks[1].pk: "s1",
        tasks[3].pk: "s0",
    }
