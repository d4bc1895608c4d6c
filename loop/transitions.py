"""Every write of a state field: checked against `loop.states`, compare-and-set, journaled.

Each function expects to run inside the caller's `transaction.atomic()`. A row whose state
moved under us (someone else won) raises `Conflict`; an illegal move raises
`IllegalTransition`. The in-memory object is updated only after the row was.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from django.utils import timezone

from . import journal, sql
from .models import Effect, EventKind, Step, Task
from .states import EFFECT, STEP, TASK


class Conflict(Exception):
    """The row was not in the state we read: another writer won the race."""


Row = TypeVar("Row", Step, Task, Effect)


def _cas_all(
    objs: Sequence[Row],
    new_state: str,
    fields: list[dict[str, Any]],
    where: list[dict[str, Any]],
    *,
    each: bool = False,
) -> list[Row]:
    """Compare-and-set these rows of one model in one statement: all of them move, or
    Conflict. After a Conflict the rows that matched have moved, in the database though not in
    memory: a caller that goes on after one undoes them (a savepoint around the call), one that
    does not lets the whole transaction roll back. With `each`, every row that still matches
    moves on its own and the others are left as they were: no Conflict, the rows that moved
    returned (as every row is without it)."""
    model = type(objs[0])
    now = timezone.now()
    changes = []
    for obj, sets in zip(objs, fields, strict=True):
        change = {"state": new_state, **sets}
        if hasattr(obj, "updated_at"):
            change.setdefault("updated_at", now)
        changes.append(change)
    pk = model._meta.pk.name  # type: ignore[union-attr]
    matches = [
        {pk: obj.pk, "state": obj.state, **match} for obj, match in zip(objs, where, strict=True)
    ]
    if each:
        changed = sql.update_each(model, changes, matches)
        moved = [
            (obj, change) for obj, change in zip(objs, changes, strict=True) if obj.pk in changed
        ]
    elif sql.update_many(model, changes, matches) != len(objs):
        raise Conflict(", ".join(f"{obj} is no longer {obj.state}" for obj in objs))
    else:
        moved = list(zip(objs, changes, strict=True))
    for obj, change in moved:
        for name, value in change.items():
            setattr(obj, name, value)
    return [obj for obj, _ in moved]


def move_steps(
    steps: Sequence[Step],
    event: str,
    *,
    kind: EventKind,
    actor: str,
    fields: list[dict[str, Any]],
    data: list[dict[str, Any]],
) -> None:
    """`move_step` for several steps, each with its own values for the same fields and its
    own journal data, in one statement: all move, or Conflict (see `_cas_all`)."""
    olds = [step.state for step in steps]
    news = {STEP.check(old, event) for old in olds}
    assert len(news) == 1, f"one statement writes one state, not {sorted(news)}"
    new = news.pop()
    _cas_all(steps, new, fields, [{} for _ in steps])
    for step, old, extra in zip(steps, olds, data, strict=True):
        journal.record(
            kind, step=step, actor=actor, old=old, new=new, attempts=step.attempts, **extra
        )


def move_step(
    step: Step,
    event: str,
    *,
    kind: EventKind,
    actor: str,
    fields: dict[str, Any] | None = None,
    data: dict[str, Any] | None = None,
) -> None:
    move_steps([step], event, kind=kind, actor=actor, fields=[fields or {}], data=[data or {}])


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
    _cas_all([task], new, [fields or {}], [{}])
    journal.record(EventKind.TASK_STATE, task=task, actor=actor, old=old, new=new, **(data or {}))


def move_effects(
    effects: Sequence[Effect],
    event: str,
    *,
    actor: str,
    fields: list[dict[str, Any]],
    where: list[dict[str, Any]],
    data: dict[str, Any] | None = None,
    each: bool = False,
) -> list[Effect]:
    """`move_effect` for several effects in one state, each with its own values for the same
    fields and conditions, in one statement: all move, or Conflict (see `_cas_all`); with
    `each`, those that still match move and are journaled, the others are left as they were.
    The effects that moved."""
    old = effects[0].state
    assert all(e.state == old for e in effects), "one statement moves effects of one state"
    new = EFFECT.check(old, event)
    moved = _cas_all(effects, new, fields, where, each=each)
    for effect in moved:
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
    return moved


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
    move_effects(
        [effect], event, actor=actor, fields=[fields or {}], where=[where or {}], data=data
    )
