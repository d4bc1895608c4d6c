"""Where a task stands in its plan, read through the partial indexes `step_open` and
`step_failed` (migration 0006), so no lookup walks a task's done steps: a step's cost does not
grow with its task's history.

The conditions are written exactly as the indexes' own (literal states, not parameters): a
partial index serves a query only when the planner can see that the query's WHERE implies the
index's, and neither SQLite nor PostgreSQL proves that through a bound parameter.
Everything runs in the caller's transaction, if any; nothing here writes.
"""

from __future__ import annotations

from django.db import connection

from . import rows
from .models import OPEN_STEP_STATES, Step, StepState, Task

OPEN = "state IN ({})".format(", ".join(f"'{state.value}'" for state in OPEN_STEP_STATES))
FAILED = f"state = '{StepState.FAILED.value}'"


def _marks(ids: list[int]) -> str:
    return ", ".join("%s" for _ in ids)


def first_open(task_ids: list[int]) -> dict[int, Step]:
    """Each task's first step that is neither done nor failed, in plan order, with one
    statement: per task, one descent of `step_open` (task_id, position) to its first entry."""
    if not task_ids:
        return {}
    step, task = Step._meta.db_table, Task._meta.db_table
    found = rows.load_all(  # only constant fragments are formatted in
        Step,
        f"id IN (SELECT (SELECT o.id FROM {step} o WHERE o.task_id = t.id AND o.{OPEN} "  # noqa: S608
        f"ORDER BY o.position LIMIT 1) FROM {task} t WHERE t.id IN ({_marks(task_ids)}))",
        task_ids,
    )
    return {s.task_id: s for s in found}


def has_unwaived_failure(task_id: int) -> bool:
    """Whether a failed step of the task still counts against it (not waived by a resume or
    a replacement): through `step_failed`, which holds failed steps only."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT 1 FROM {Step._meta.db_table} "  # noqa: S608
            f"WHERE task_id = %s AND {FAILED} AND NOT waived LIMIT 1",
            [task_id],
        )
        return cursor.fetchone() is not None


def counts(task_ids: list[int]) -> dict[int, tuple[int, int]]:
    """(done, total) steps of each task, waived failures counted as done, with three small
    statements: the total from the (task, position) unique index alone, the steps still open
    from `step_open` and the failed ones from `step_failed`; done is what is neither."""
    if not task_ids:
        return {}
    table, marks = Step._meta.db_table, _marks(task_ids)
    result = {}
    with connection.cursor() as cursor:
        parts = []
        for extra in ("", f" AND {OPEN}", f" AND {FAILED} AND NOT waived"):
            cursor.execute(
                f"SELECT task_id, COUNT(*) FROM {table} "  # noqa: S608
                f"WHERE task_id IN ({marks}){extra} GROUP BY task_id",
                task_ids,
            )
            parts.append(dict(cursor.fetchall()))
    total, still_open, failed = parts
    for task_id in task_ids:
        all_steps = total.get(task_id, 0)
        result[task_id] = (
            all_steps - still_open.get(task_id, 0) - failed.get(task_id, 0),
            all_steps,
        )
    return result
