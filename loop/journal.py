"""The journal: one writer for events.

`record()` appends an event inside the caller's transaction (it refuses to run outside one),
so a change and its event commit together or not at all. Inside `batched()` (the worker's
batch commits) the events wait and are written together, in order, by one statement at the
end of the block, still inside its transaction. After the commit, in-process listeners (the
live tailer) are woken. Other processes: on PostgreSQL each commit that journaled something
notifies `NOTIFY_CHANNEL` (a trigger on the table, migration 0011), which the live tailers
LISTEN on; on SQLite they poll the file for new ids.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from . import sql
from .models import Effect, Event, EventKind, Step, Task

log = logging.getLogger("loop.journal")

NOTIFY_CHANNEL = "loop_journal"  # PostgreSQL: notified by every commit that journaled
_listeners: list[Callable[[], None]] = []
_COLUMNS = ("kind", "task", "step", "effect", "actor", "data", "created_at")
_held = threading.local()  # the rows of the current `batched()` block, per thread


def on_event(listener: Callable[[], None]) -> None:
    """Call `listener` after every commit that journaled something in this process."""
    _listeners.append(listener)


def _wake() -> None:
    for listener in list(_listeners):
        try:
            listener()
        except Exception:  # a broken listener must never fail a commit that already happened
            log.exception("journal listener failed")


def record(
    kind: EventKind | str,
    *,
    task: Task | int | None = None,
    step: Step | int | None = None,
    effect: Effect | None = None,
    actor: str = "",
    **data: Any,
) -> None:
    """Append one event. Call inside `transaction.atomic()` with the change it records."""
    held: list[list[Any]] | None = getattr(_held, "rows", None)
    if held is not None:
        ops, now = _held.ops, _held.now  # looked up once, when the batch began
    elif connection.in_atomic_block:
        ops = connection.ops
        now = ops.adapt_datetimefield_value(timezone.now())
    else:
        raise RuntimeError(f"journal.record({kind}) outside a transaction")
    if effect is not None and step is None:
        raise ValueError(f"journal.record({kind}): an event naming an effect names its step")
    task_id = task.pk if isinstance(task, Task) else task
    if task_id is None and isinstance(step, Step):
        task_id = step.task_id
    row = [
        str(kind),
        task_id,
        step.pk if isinstance(step, Step) else step,
        effect.pk if effect is not None else None,
        actor,
        ops.adapt_json_value(data, None),  # what Event.data (a JSONField) would store
        now,
    ]
    if held is not None:
        held.append(row)
    else:
        _write([row])


@contextmanager
def batched() -> Iterator[None]:
    """Inside a transaction: the events recorded in this block are written at its end, in
    order, with one statement, all with the time the block began (they commit together). If
    the block raises, they are dropped with its transaction."""
    if getattr(_held, "rows", None) is not None:
        yield  # already inside a batch: its end writes these too
        return
    if not connection.in_atomic_block:
        raise RuntimeError("journal.batched() outside a transaction")
    held: list[list[Any]] = []
    _held.rows = held
    _held.ops = connection.ops
    _held.now = connection.ops.adapt_datetimefield_value(timezone.now())
    try:
        yield
    finally:
        _held.rows = None
    if held:
        _write(held)


def _write(held: list[list[Any]]) -> None:
    sql.insert_rows(Event, _COLUMNS, held)
    if _listeners:
        transaction.on_commit(_wake)
