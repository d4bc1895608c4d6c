"""A done verdict and the start of the task's next step commit together, under the same lease,
unless the task stopped running, the worker is draining, or the verdict was not `done`."""

from __future__ import annotations

from loop import actions
from loop.judges import Verdict
from loop.models import Event, Task
from loop.permissions import SYSTEM
from loop.step_life import Started
from loop.worker import Worker

from .conftest import claim_and_start, make_task, step


def test_a_task_runs_all_its_steps_under_one_claim(worker: Worker) -> None:
    task = make_task(step("a"), step("b"), step("c"))
    assert worker.tick() is True
    task.refresh_from_db()
    assert task.state == "done" and task.lease_epoch == 1 and task.lease_owner is None
    kinds = list(
        Event.objects.filter(task=task, step__isnull=False).values_list("kind", "step__key")
    )
    assert kinds == [
        ("step_started", "a"),
        ("step_done", "a"),
        ("step_started", "b"),
        ("step_done", "b"),
        ("step_started", "c"),
        ("step_done", "c"),
    ]


def test_the_next_step_starts_in_the_verdicts_commit(worker: Worker) -> None:
    task = make_task(step("a"), step("b"))
    a = claim_and_start(worker)
    [b] = worker.commit_batch([(a, Verdict.done({"value": "a"}))], [])
    assert isinstance(b, Started) and b.step.key == "b" and b.epoch == a.epoch
    task.refresh_from_db()
    assert task.lease_owner == worker.worker_id  # still held: nobody else may take b
    assert task.steps.get(key="b").state == "running"


def test_a_task_paused_while_its_step_ran_does_not_go_on(worker: Worker) -> None:
    task = make_task(step("a"), step("b"))
    a = claim_and_start(worker)
    actions.pause(task_id=task.pk, actor="dad", user=SYSTEM)
    assert worker.commit_batch([(a, Verdict.done({"value": "a"}))], []) == []
    task.refresh_from_db()
    assert task.state == "paused" and task.lease_owner is None
    assert task.steps.get(key="a").state == "done" and task.steps.get(key="b").state == "pending"


def test_a_draining_worker_finishes_its_step_and_takes_no_next_one(worker: Worker) -> None:
    task = make_task(step("a"), step("b"))
    a = claim_and_start(worker)
    worker.stopping = True  # the first SIGTERM
    assert worker.commit_batch([(a, Verdict.done({"value": "a"}))], []) == []
    assert Task.objects.get(pk=task.pk).lease_owner is None
    assert task.steps.get(key="b").state == "pending"


def test_a_retry_verdict_lets_the_lease_go(worker: Worker) -> None:
    task = make_task(step("a"), step("b"))
    a = claim_and_start(worker)
    assert worker.commit_batch([(a, Verdict.retry("flaky", delay=60))], []) == []
    task.refresh_from_db()
    assert task.lease_owner is None and task.run_after is not None


def test_a_long_task_lets_others_have_a_turn(db: None, settings) -> None:  # type: ignore[no-untyped-def]
    settings.LOOP_CHAIN_SECONDS = 0  # no chaining past the first step of a claim
    worker = Worker(label="one at a time", batch=1)
    worker.boot()
    long = make_task(*(step(f"l{i}") for i in range(4)), title="long")
    short = make_task(step("s"), title="short")
    worker.tick()  # long's first step; the lease goes back
    worker.tick()  # the least-claimed task next: short, not long again
    assert Task.objects.get(pk=short.pk).state == "done"
    assert long.steps.filter(state="done").count() == 1
