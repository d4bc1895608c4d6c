"""Every write of a state field: checked against `loop.states`, compare-and-set, journaled.

Each function expects to run inside the caller's `transaction.atomic()`. A row whose state
moved under us (someone else won) raises `Conflict`; an illegal move raises
`IllegalTransition`. The in-memory object is updated only after the row was.
"""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from . import journal, rows
from .models import Effect, EventKind, Step, Task
from .states import EFFECT, STEP, TASK


class Conflict(Exception):
    """The row was not in the state we read: another writer won the race."""


def _cas(
    obj: Step | Task | Effect,
    new_state: str,
    fields: dict[str, Any],
    where: dict[str, Any] | None = None,
) -> None:
    model = type(obj)
    changes = {"state": new_state, **fields}
    if hasattr(obj, "updated_at"):
        changes.setdefault("updated_at", timezone.now())
    match = {model._meta.pk.name: obj.pk, "state": obj.state, **(where or {})}  # type: ignore[union-attr]
    if rows.update(model, changes, match) != 1:
        raise Conflict(f"{obj} is no longer {obj.state}")
    for name, value in changes.items():
        setattr(obj, name, value)


def move_step(
    step: Step,
    event: str,
    *,
    kind: EventKind,
    actor: str,
    fields: dict[str, Any] | None = None,
    data: dict[str, Any] | None = None,
) -> None:
    old = step.state
    new = STEP.check(old, event)
    _cas(step, new, fields or {})
    journal.record(
        kind, step=step, actor=actor, old=old, new=new, attempts=step.attempts, **(data or {})
    )


def move_task(
    task: Task,
    event: str,
    *,
    actor: str,
    fields: dict[str, Any] | None = None,
    data: dict[str, Any] | None = None,
) -> None:
    old = task.state
    new = TASK.check(old, event)
    _cas(task, new, fields or {})
    journal.record(EventKind.TASK_STATE, task=task, actor=actor, old=old, new=new, **(data or {}))


def move_effect(
    effect: Effect,
    event: str,
    *,
    actor: str,
    fields: dict[str, Any] | None = None,
    where: dict[str, Any] | None = None,
    data: dict[str, Any] | None = None,
) -> None:
    """`where` narrows the compare-and-set (e.g. the claiming worker's lease)."""
    old = effect.state
    new = EFFECT.check(old, event)
    _cas(effect, new, fields or {}, where)
    journal.record(
        EventKind.EFFECT_STATE,
        task=effect.task_id,
        step=effect.step_id,
        effect=effect,
        actor=actor,
        old=old,
        new=new,
        **(data or {}),
    )
