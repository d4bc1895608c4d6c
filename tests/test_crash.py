"""A real `runloop` killed with SIGKILL at random moments, again and again, over multi-step
plans whose tool records every execution. A cut costs each task at most its step in flight.

Most workers are forked from a pre-loaded Django (tests/support/forkserver.py), as in
test_chaos.py: each is still its own process running the `runloop` command, but the kills do not
wait on Django's imports. Every REAL_EVERY-th, and the survivor, is a plain `manage.py runloop`
subprocess, start-up and all."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
from django.conf import settings

from loop.models import Event, Step, Task, TaskState, Worker

from .conftest import kill, make_task, process_env, start_runloop, step, wait_for
from .support.forkserver import ForkServer
from .support.loopapp.tools import read_runs

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

KILLS = 50
REAL_EVERY = 10  # every 10th worker killed is a plain `manage.py runloop`
TASKS_PER_BATCH = 6
STEPS_PER_TASK = 5
MAX_ATTEMPTS = 100  # high enough that 50 kills can't exhaust a step: every task must finish


def add_batch(log: Path, batch: int) -> None:
    for n in range(TASKS_PER_BATCH):
        make_task(
            *(
                step(
                    f"s{i}",
                    "test.record",
                    args={"log": str(log), "sleep_ms": [0, 40]},
                    max_attempts=MAX_ATTEMPTS,
                )
                for i in range(STEPS_PER_TASK)
            ),
            title=f"crash batch {batch} task {n}",
        )


def start_and_kill(
    rng: random.Random, out: Path, seen_worker: int, forks: ForkServer | None
) -> int:
    """Start a worker (forked, or with `forks` None the plain command) and SIGKILL it: usually
    a little while after it booted (mid-step), now and then at a random moment of its start-up.
    Returns the newest worker row id."""
    if forks is None:
        proc = start_runloop(log=out)
        pid = proc.pid
    else:
        pid = forks.spawn(out)
    try:
        if rng.random() < 0.2:
            time.sleep(rng.uniform(0, 1.0))
        else:
            wait_for(lambda: Worker.objects.filter(pk__gt=seen_worker, pid=pid).exists())
            time.sleep(rng.uniform(0, 0.25))
    finally:
        if forks is None:
            kill(proc)
        else:
            forks.kill(pid)  # SIGKILL, then reaped: the pid is gone before the next boot
    return Worker.objects.order_by("-pk").values_list("pk", flat=True).first() or seen_worker


def test_sigkill_at_random_moments_costs_at_most_the_step_in_flight(
    tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    seed = int(os.environ.get("CRASH_SEED", random.randrange(2**32)))
    print(f"CRASH_SEED={seed}")
    rng = random.Random(seed)
    log, out = tmp_path / "runs.log", tmp_path / "runloop.out"
    batches = 0
    seen_worker = 0
    forks = ForkServer(process_env())
    try:
        for kill_no in range(KILLS):
            if not Task.objects.open().exists():  # keep the worker fed until the last kill
                add_batch(log, batches)
                batches += 1
            real = kill_no % REAL_EVERY == REAL_EVERY - 1
            seen_worker = start_and_kill(rng, out, seen_worker, None if real else forks)
    finally:
        forks.close()

    survivor = start_runloop(log=out)
    processes.append(survivor)
    # Booted first: a SIGTERM before the worker installed its handlers would just end it.
    wait_for(lambda: Worker.objects.filter(pk__gt=seen_worker, pid=survivor.pid).exists())
    wait_for(lambda: not Task.objects.open().exists(), timeout=90)
    survivor.send_signal(signal.SIGTERM)
    assert survivor.wait(timeout=30) == 0

    tasks = Task.objects.all()
    assert len(tasks) == batches * TASKS_PER_BATCH
    assert {t.state for t in tasks} == {TaskState.DONE}

    runs = read_runs(log)
    by_step: dict[tuple[int, str], list] = {}
    for run in runs:
        by_step.setdefault((run.task, run.step), []).append(run)
    cuts = Event.objects.filter(kind="step_restarted", data__cut=True).count()
    extra_runs = 0
    lost: Counter[tuple[int, int]] = Counter()  # (pid, task): runs whose verdict never landed
    for s in Step.objects.all():
        mine = by_step.get((s.task_id, s.key), [])
        attempts = [run.attempt for run in mine]
        # Every execution follows its own committed start, so attempts number them uniquely.
        assert len(attempts) == len(set(attempts)), f"{s}: one start executed twice: {attempts}"
        assert 1 <= s.attempts <= s.max_attempts
        assert len(mine) <= s.attempts
        # The output came from the last start, and nothing ran after the done commit: no run
        # with a later attempt, and none under a later lease epoch.
        finisher = next(run for run in mine if run.attempt == s.attempts)
        assert s.output == {"pid": finisher.pid, "epoch": finisher.epoch, "attempt": s.attempts}
        assert finisher.end is not None
        assert all(run.attempt <= s.attempts and run.epoch <= finisher.epoch for run in mine)
        starts = Counter(
            Event.objects.filter(step=s, kind__in=["step_started", "step_restarted"]).values_list(
                "kind", flat=True
            )
        )
        assert starts["step_started"] == 1 and starts["step_restarted"] == s.attempts - 1
        done = Event.objects.get(step=s, kind="step_done")
        assert done.data["attempts"] == s.attempts
        extra_runs += len(mine) - 1
        lost.update((run.pid, run.task) for run in mine if run is not finisher)
    print(f"{KILLS} kills, {len(tasks)} tasks, {len(runs)} executions, {cuts} cut steps re-entered")
    # A kill costs each task at most its step in flight (a worker moves a batch of tasks at
    # once, so one kill may cut a step of each), and every run again is a cut re-entered.
    assert all(count == 1 for count in lost.values()), lost
    assert extra_runs <= cuts <= KILLS * settings.LOOP_BATCH
    assert cuts > 0, "no kill landed while a step was in flight"
