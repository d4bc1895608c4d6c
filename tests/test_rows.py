"""The tick's hand-written SQL reads and writes rows exactly as the ORM would."""

from __future__ import annotations

from datetime import timedelta

from django.db import transaction
from django.forms.models import model_to_dict
from django.utils import timezone

from loop import rows
from loop.models import Effect, Step, Task

from .conftest import make_task, step


def test_a_loaded_row_equals_the_orms(db: None) -> None:
    task = make_task(step("a", args={"value": {"nested": [1, "two", None]}}))
    Step.objects.filter(task=task).update(output={"x": 1.5}, started_at=timezone.now())
    orm = Step.objects.get(task=task)
    loaded = rows.load(Step, "task_id = %s", [task.pk])
    assert loaded is not None and model_to_dict(loaded) == model_to_dict(orm)
    assert rows.load(Step, "task_id = %s", [task.pk + 1000]) is None


def test_update_and_insert_write_what_the_orm_reads_back(db: None) -> None:
    task = make_task(step("a"))
    a = task.steps.get()
    later = timezone.now() + timedelta(minutes=5)
    with transaction.atomic():
        changed = rows.update(
            Step,
            {"output": {"ok": [True]}, "retry_at": later, "error": "", "attempts": 2},
            {"id": a.pk, "state": "pending", "finished_at": None},
        )
        assert changed == 1
        assert rows.update(Step, {"attempts": 3}, {"id": a.pk, "state": "done"}) == 0
        [intent] = rows.create_many(
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
