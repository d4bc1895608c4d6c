"""Two `runloop` processes on one SQLite file: a task has at most one lease holder, and a
holder whose lease moved on has its verdict refused and journaled."""

from __future__ import annotations

import signal
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest
from django.db import transaction

from loop.models import Event, Step, Task, TaskState, Worker

from .conftest import make_task, process_env, start_runloop, step, wait_for
from .support.loopapp.tools import read_runs

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def booted(proc: subprocess.Popen[bytes]) -> Worker:
    return wait_for(lambda: Worker.objects.filter(pid=proc.pid, state="running").first())


def stop(*procs: subprocess.Popen[bytes]) -> None:
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        assert proc.wait(timeout=30) == 0


def test_two_workers_share_100_tasks_and_never_run_a_step_at_once(
    tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    log = tmp_path / "runs.log"
    workers = [start_runloop(log=tmp_path / f"runloop{n}.out") for n in (1, 2)]
    processes.extend(workers)
    for proc in workers:
        booted(proc)
    with transaction.atomic():  # all 100 appear at once, so both workers compete for them
        for n in range(100):
            make_task(
                *(
                    step(k, "test.record", args={"log": str(log), "sleep_ms": [0, 8]})
                    for k in ("fetch", "think", "answer")
                ),
                title=f"shared {n}",
            )
    wait_for(lambda: not Task.objects.open().exists(), timeout=120)
    stop(*workers)

    assert set(Task.objects.values_list("state", flat=True)) == {TaskState.DONE}
    runs = read_runs(log)
    assert all(run.end is not None for run in runs)
    # Nothing failed, so every step ran exactly once, under the lease that committed it.
    assert len(runs) == Step.objects.count() == 300
    holders: dict[tuple[int, int], set[int]] = defaultdict(set)
    on_step: dict[tuple[int, str], list] = defaultdict(list)
    for run in runs:
        holders[(run.task, run.epoch)].add(run.pid)
        on_step[(run.task, run.step)].append(run)
    assert all(len(pids) == 1 for pids in holders.values()), "one lease epoch, two processes"
    for (task, key), mine in on_step.items():
        mine.sort(key=lambda run: run.begin)
        for earlier, later in zip(mine, mine[1:], strict=False):
            assert earlier.end <= later.begin, f"task {task} step {key} ran twice at once"
        output = Step.objects.get(task_id=task, key=key).output
        assert output == {"pid": mine[-1].pid, "epoch": mine[-1].epoch, "attempt": 1}
    assert {run.pid for run in runs} == {proc.pid for proc in workers}, "both workers worked"
    assert not Event.objects.filter(kind="late_result").exists()


def test_a_sleeper_whose_lease_moved_on_has_its_verdict_refused_and_journaled(
    tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    log = tmp_path / "runs.log"
    # The sleeper's lease is 1 s and it stops renewing after 1 s: its 5 s step outlives it.
    sleeper_env = process_env(
        LOOP_LEASE_SECONDS="1", LOOP_STEP_TIMEOUT="1", LOOP_HEARTBEAT_SECONDS="1"
    )
    sleeper = start_runloop(env=sleeper_env, log=tmp_path / "sleeper.out")
    processes.append(sleeper)
    sleeper_row = booted(sleeper)
    task = make_task(step("slow", "test.record", args={"log": str(log), "first_sleep": 5}))
    slow = task.steps.get()
    wait_for(lambda: Event.objects.filter(step=slow, kind="step_started").exists())

    successor = start_runloop(log=tmp_path / "successor.out")
    processes.append(successor)
    successor_row = booted(successor)
    late = wait_for(lambda: Event.objects.filter(step=slow, kind="late_result").first())
    stop(sleeper, successor)

    assert late.actor == f"worker:{sleeper_row.pk}" and late.data["verdict"] == "done"
    slow.refresh_from_db()
    task.refresh_from_db()
    assert task.state == TaskState.DONE and slow.state == "done" and slow.attempts == 2
    assert slow.output == {"pid": successor.pid, "epoch": 2, "attempt": 2}
    done = Event.objects.get(step=slow, kind="step_done")
    assert done.actor == f"worker:{successor_row.pk}" and done.pk < late.pk
    first, second = read_runs(log)
    assert (first.pid, first.epoch, first.attempt) == (sleeper.pid, 1, 1)
    assert (second.pid, second.epoch, second.attempt) == (successor.pid, 2, 2)
