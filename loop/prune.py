"""Retention: finished tasks' history older than a window goes, in small batches.

A task that is done, failed or superseded (terminal: it never runs again) and was last changed
before the window loses its events, effects and steps, then the task row itself; journal rows
of no task (workers') older than the window go too; and API command receipts older than both
the window and LOOP_RECEIPT_REPLAY_DAYS, unless their command names a task still open. Nothing
of an unfinished task is ever touched.

Each batch is one short transaction of at most `BATCH` rows of one table (SQLite holds its one
write lock for a transaction's length), in the order the constraints need: events (they name
steps), effects, steps, tasks. Events go in id order, so a task whose first event is still there
has lost none (the live feed relies on that: a page whose last seen event is gone reloads).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import models, transaction
from django.db.models import Q
from django.utils import timezone

from .models import ENDED_TASK_STATES, Effect, Event, Receipt, Step, Task

BATCH = 500
MAX_DAYS = 36500  # a hundred years: the same bound as LOOP_PRUNE_AFTER_DAYS
TABLES = ("events", "effects", "steps", "tasks", "receipts")
_TASK_IN_SCOPE = re.compile(r"/tasks/(\d+)(?:/|$)")


@dataclass(frozen=True)
class Window:
    """What is old enough to go: tasks finished and history written before `before`;
    receipts stored before `receipts_before` (never inside their replay window)."""

    before: datetime
    receipts_before: datetime

    @classmethod
    def of(cls, days: float) -> Window:
        if not 0 <= days <= MAX_DAYS:  # nan and inf too
            raise ValueError(f"older-than: must be a number of days from 0 to {MAX_DAYS}")
        now = timezone.now()
        before = now - timedelta(days=days)
        replay = now - timedelta(days=settings.LOOP_RECEIPT_REPLAY_DAYS)
        return cls(before=before, receipts_before=min(before, replay))


def old_tasks(window: Window) -> models.QuerySet[Task]:
    return Task.objects.filter(state__in=ENDED_TASK_STATES, updated_at__lt=window.before)


def candidates(table: str, window: Window) -> models.QuerySet[models.Model]:
    """The rows of `table` that may go (receipts still pass `_keep_receipts`)."""
    tasks = old_tasks(window).values("pk")
    found: models.QuerySet[models.Model]
    if table == "events":
        found = Event.objects.filter(
            Q(task__in=tasks) | Q(task__isnull=True, created_at__lt=window.before)
        )
    elif table == "effects":
        found = Effect.objects.filter(task__in=tasks)
    elif table == "steps":
        found = Step.objects.filter(task__in=tasks)
    elif table == "tasks":
        found = old_tasks(window)
    elif table == "receipts":
        found = Receipt.objects.filter(created_at__lt=window.receipts_before)
    else:
        raise ValueError(f"table: {table!r} is not one of {', '.join(TABLES)}")
    return found


def _keep_receipts(rows: list[tuple[int, str]]) -> list[int]:
    """The receipt ids among (id, scope) that may go: not those naming an open task."""
    named = {int(m.group(1)) for _, scope in rows if (m := _TASK_IN_SCOPE.search(scope))}
    open_ids = set(Task.objects.filter(pk__in=named).open().values_list("pk", flat=True))
    going = []
    for pk, scope in rows:
        match = _TASK_IN_SCOPE.search(scope)
        if match is None or int(match.group(1)) not in open_ids:
            going.append(pk)
    return going


def _receipt_ids(window: Window, limit: int) -> list[int]:
    """Up to `limit` receipts that may go, read page by page past those that stay."""
    found = candidates("receipts", window).order_by("pk")
    last = 0
    while rows := list(found.filter(pk__gt=last).values_list("pk", "scope")[:limit]):
        ids = _keep_receipts(rows)
        if ids:
            return ids
        last = rows[-1][0]
    return []


def prune_batch(table: str, window: Window, *, limit: int = BATCH) -> int:
    """Delete up to `limit` rows of `table` in one transaction; how many went."""
    # Receipts are read first, outside the write transaction (a task never reopens).
    receipts = _receipt_ids(window, limit) if table == "receipts" else []
    with transaction.atomic():
        found = candidates(table, window).order_by("pk")
        if table == "receipts":
            ids = list(found.filter(pk__in=receipts).values_list("pk", flat=True))
        else:
            ids = list(found.values_list("pk", flat=True)[:limit])
        if not ids:
            return 0
        gone: models.QuerySet[models.Model]
        if table == "tasks":
            # Re-checked here: only a task still finished and old goes (its history already
            # went; the cascade finds nothing left but a late row).
            gone = old_tasks(window).filter(pk__in=ids)
        else:
            gone = found.model._default_manager.filter(pk__in=ids)
        gone.delete()
        return len(ids)


def counts(window: Window) -> dict[str, int]:
    """What would go now, per table (a dry run)."""
    result = {}
    for table in TABLES:
        if table == "receipts":
            rows = list(candidates(table, window).values_list("pk", "scope"))
            result[table] = len(_keep_receipts(rows))
        else:
            result[table] = candidates(table, window).count()
    return result


def prune(
    window: Window,
    *,
    limit: int = BATCH,
    max_batches: int | None = None,
    each: Callable[[str, int], None] | None = None,
) -> dict[str, int]:
    """Batches until nothing is left (or `max_batches` ran); rows deleted per table."""
    done = dict.fromkeys(TABLES, 0)
    batches = 0
    for table in TABLES:
        while max_batches is None or batches < max_batches:
            went = prune_batch(table, window, limit=limit)
            if not went:
                break
            batches += 1
            done[table] += went
            if each is not None:
                each(table, went)
    return done
