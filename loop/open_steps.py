"""Where a task stands in its plan, read through the partial indexes `step_open` and
`step_failed` (their statements are in `loop.sql`), so no lookup walks a task's done steps: a
step's cost does not grow with its task's history. "Open" is `Step.objects.open()`'s rule
(`models.OPEN_STEP`, `OPEN_STEP_ORDER`). Everything runs in the caller's transaction, if any;
nothing here writes.
"""

from __future__ import annotations

from . import sql
from .models import Step


def first_open(task_ids: list[int]) -> dict[int, Step]:
    """Each task's first step that is neither done nor failed, in plan order (the first row
    of `Step.objects.open()` per task), with one statement."""
    return {step.task_id: step for step in sql.first_open_steps(task_ids)}


def has_unwaived_failure(task_id: int) -> bool:
    """Whether a failed step of the task still counts against it (not waived by a resume or
    a replacement)."""
    return sql.has_unwaived_failure(task_id)


def counts(task_ids: list[int]) -> dict[int, tuple[int, int]]:
    """(done, total) steps of each task, waived failures counted as done: done is what is
    neither open nor failed."""
    if not task_ids:
        return {}
    total, still_open, failed = sql.step_counts(task_ids)
    return {
        task_id: (
            total.get(task_id, 0) - still_open.get(task_id, 0) - failed.get(task_id, 0),
            total.get(task_id, 0),
        )
        for task_id in task_ids
    }
