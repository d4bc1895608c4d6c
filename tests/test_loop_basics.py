"""The tick end to end, in process: steps run in order, outputs flow, tasks finish."""

from __future__ import annotations

from pathlib import Path

import pytest

from loop import actions, step_life
from loop.models import Event, Step, Task
from loop.permissions import SYSTEM
from loop.worker import Worker

from .conftest import make_task, run_until_idle, step


def test_steps_run_in_order_and_outputs_flow(worker: Worker) -> None:
    task = make_task(
        step("a", args={"value": {"n": 2}}),
        step("b", args={"value": "n is ${a.value.n}"}),
    )
    run_until_idle(worker)
    task.refresh_from_db()
    assert task.state == "done"
    b = task.steps.get(key="b")
    assert b.output == {"value": "n is 2"} and b.attempts == 1
    kinds = list(Event.objects.filter(task=task).values_list("kind", flat=True))
    assert kinds.count("step_started") == 2 and kinds.count("step_done") == 2


def test_transient_error_retries_then_fails_at_the_cap(
    worker: Worker, file_root: Path, settings
) -> None:  # type: ignore[no-untyped-def]
    settings.LOOP_RETRY_BASE_SECONDS = 0
    task = make_task(
        step("fetch", "http.get", args={"url": "http://127.0.0.1:9/nothing"}, max_attempts=3),
        step("after"),
    )
    run_until_idle(worker)
    fetch = task.steps.get(key="fetch")
    assert fetch.state == "failed" and fetch.attempts == 3
    assert "gave up after 3 attempts" in fetch.error
    task.refresh_from_db()
    assert task.state == "paused"  # "after" remains: the task waits for a person


def test_failed_step_pauses_task_until_resume(worker: Worker, file_root: Path) -> None:
    task = make_task(step("read", "file.read", args={"path": "missing.txt"}), step("after"))
    run_until_idle(worker)
    task.refresh_from_db()
    assert task.state == "paused"
    assert task.steps.get(key="read").state == "failed"
    actions.resume(task_id=task.pk, actor="dad", user=SYSTEM)
    run_until_idle(worker)
    task.refresh_from_db()
    assert task.state == "done"
    assert task.steps.get(key="after").state == "done"


def test_add_steps_after_a_key_and_supersede(worker: Worker) -> None:
    task = make_task(step("a"), step("c"))
    actions.add_steps(task_id=task.pk, steps=[step("b")], after="a", actor="pippa", user=SYSTEM)
    assert list(task.steps.order_by("position").values_list("key", flat=True)) == ["a", "b", "c"]
    from loop import plans

    successor = actions.supersede(
        task_id=task.pk,
        plan=plans.validate({"title": "v2", "steps": [step("x")]}),
        actor="pippa",
        user=SYSTEM,
    )
    run_until_idle(worker)
    task.refresh_from_db()
    assert task.state == "superseded" and task.successor_id == successor.pk
    assert not Step.objects.filter(task=task, state="done").exists()
    assert Task.objects.get(pk=successor.pk).state == "done"


def test_stale_holder_commit_is_refused_and_journaled(worker: Worker) -> None:
    from loop.judges import Verdict
    from loop.step_life import Started

    task = make_task(step("a"))
    from django.db import transaction

    from loop import lease

    with transaction.atomic():
        task_id, epoch = lease.claim(worker.worker_id)  # type: ignore[misc]
        started = step_life.begin_one(task_id, worker.holding(epoch))
    assert isinstance(started, Started)
    Task.objects.filter(pk=task.pk).update(lease_until=None)  # the lease ran out
    other = Worker(label="other")
    other.boot()
    with transaction.atomic():
        assert lease.claim(other.worker_id) == (task.pk, epoch + 1)
    assert step_life.commit_one(started, Verdict.done({"late": True})) is False
    assert Event.objects.filter(kind="late_result", step=started.step).exists()
    assert Step.objects.get(pk=started.step.pk).output is None


@pytest.mark.parametrize("bad", ["pause", "resume"])
def test_illegal_task_moves_are_refused(db: None, bad: str) -> None:
    task = make_task(step("a"))
    if bad == "resume":
        with pytest.raises(actions.Refused, match="can't resume when running"):
            actions.resume(task_id=task.pk, actor="dad", user=SYSTEM)
    else:
        actions.pause(task_id=task.pk, actor="dad", user=SYSTEM)
        with pytest.raises(actions.Refused, match="can't pause when paused"):
            actions.pause(task_id=task.pk, actor="dad", user=SYSTEM)


def test_a_step_whose_tool_is_gone_fails_naming_it(worker: Worker) -> None:
    task = make_task(step("a"), step("b"))
    Step.objects.filter(task=task, key="a").update(tool="gone.tool")  # its app was removed
    worker.tick()
    a = task.steps.get(key="a")
    assert a.state == "failed" and "unknown tool 'gone.tool'" in a.error
    task.refresh_from_db()
    assert task.state == "paused"  # "b" waits for a person, as after any failed step
