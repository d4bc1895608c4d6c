"""Recovering from a failed step (issue 28, item 2): Retry puts a replacement with a fresh
attempt cap under the same key (the guard asks as it did), Skip waives it naming the steps that
would break; the same actions on the dashboard, the API and the command line."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client

from loop import actions
from loop.api.core import issue
from loop.models import Step, StepState, Task, TaskState
from loop.permissions import SYSTEM
from loop.worker import Worker

from .conftest import make_task, run_until_idle, step


def failing_task(root: Path) -> Task:
    """read fails (its file is missing, one attempt); show uses its output; pay asks first."""
    return make_task(
        step("read", "file.read", args={"path": "note.txt"}, max_attempts=1),
        step("show", args={"value": "${read.content}"}),
        title="Read the note",
    )


def test_retry_replaces_the_failed_step_and_the_task_runs_on(
    worker: Worker, file_root: Path, dad: User
) -> None:
    task = failing_task(file_root)
    run_until_idle(worker)
    task.refresh_from_db()
    failed = Step.objects.get(task=task, key="read")
    assert (task.state, failed.state) == (TaskState.PAUSED, StepState.FAILED)
    assert [s.key for s in actions.breaks_if_skipped(failed)] == ["show"]
    page = Client()
    page.force_login(dad)
    home = page.get("/").content.decode()
    assert f'id="failed-{failed.pk}"' in home and "Retry" in home and "Skip" in home
    (file_root / "note.txt").write_text("hello")
    answer = page.post(f"/steps/{failed.pk}/retry")
    assert answer.status_code in (200, 302)
    run_until_idle(worker)
    task.refresh_from_db()
    assert task.state == TaskState.DONE
    steps = {s.key: s for s in task.steps.all()}
    assert set(steps) == {"read.failed-1", "read", "show"}
    assert steps["read"].attempts == 1 and steps["show"].output == {"value": "hello"}
    assert steps["read.failed-1"].waived
    # Nothing to retry twice; a done step is not failed.
    with pytest.raises(actions.Refused, match="not failed"):
        actions.retry_step(step_id=failed.pk, actor="dad", user=dad)


def test_skip_names_what_breaks_and_the_api_and_command_do_the_same(
    worker: Worker, file_root: Path, dad: User
) -> None:
    first = failing_task(file_root)
    second = failing_task(file_root)
    run_until_idle(worker)
    one, two = (Step.objects.get(task=t, key="read") for t in (first, second))
    page = Client()
    page.force_login(dad)
    shown = page.get(f"/tasks/{first.pk}").content.decode()
    assert "Skipping it breaks" in shown and "show" in shown
    # An agent may skip with Dad's permissions but never retry: more attempts are Dad's to give.
    _, token = issue(name="helper", user=dad)
    actions.give(task_id=first.pk, agent="helper", actor="dad", user=SYSTEM)
    agent = Client(HTTP_AUTHORIZATION=f"Bearer {token}")

    def post(path: str, key: str) -> Any:
        headers = {"Idempotency-Key": key}
        return agent.post(path, "{}", content_type="application/json", headers=headers)

    assert post(f"/api/steps/{one.pk}/retry", "k1").status_code == 403
    skipped = post(f"/api/steps/{one.pk}/skip", "k2")
    assert skipped.status_code == 200, skipped.content
    run_until_idle(worker)
    first.refresh_from_db()
    assert first.state == TaskState.FAILED  # show failed for want of read's output
    call_command("retry", str(two.pk), stdout=io.StringIO())
    with pytest.raises(CommandError, match="not failed"):
        call_command("skip", str(two.pk), stdout=io.StringIO())
    assert Step.objects.get(task=second, key="read").state == StepState.PENDING
    with pytest.raises(actions.Refused, match="never run again"):
        actions.skip_step(
            step_id=Step.objects.get(task=first, key="show").pk, actor="x", user=SYSTEM
        )
