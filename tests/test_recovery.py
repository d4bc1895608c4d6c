"""Fast recovery (DESIGN.md §8, §9): a live worker settles a dead peer's work as boot does, so
the cut step starts again long before its lease runs out; a worker that still lives (same
host) or still heartbeats is never settled, and when a stale one comes back, the fence refuses
its commit."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from loop.models import Event, Step, Task, Worker

from .conftest import make_task, process_env, start_runloop, step, wait_for
from .support.loopapp.tools import read_runs

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

LEASE = "300"  # far longer than any wait below: a takeover here is never a lease running out


def env(**extra: str) -> dict[str, str]:
    return process_env(
        LOOP_LEASE_SECONDS=LEASE,
        LOOP_HEARTBEAT_SECONDS="1",
        LOOP_WORKER_DEAD_AFTER="2",
        LOOP_IDLE_SLEEP_MS="50",
        **extra,
    )


def cut_task(log: Path, first_sleep: float) -> Task:
    return make_task(
        step("cut", "test.record", args={"log": str(log), "first_sleep": first_sleep}),
        title="cut mid-step",
    )


def worker_named(label: str) -> Worker:
    return wait_for(lambda: Worker.objects.filter(label=label).order_by("-pk").first())


def time_ago(seconds: float) -> datetime:
    return timezone.now() - timedelta(seconds=seconds)


def first_begun(log: Path) -> None:
    wait_for(lambda: len(read_runs(log)) == 1)


def test_a_live_worker_takes_over_a_killed_same_host_workers_step(
    tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    log = tmp_path / "runs.log"
    task = cut_task(log, first_sleep=600)
    doomed = start_runloop("--worker-id", "doomed", env=env())
    processes.append(doomed)
    first_begun(log)  # the doomed worker is mid-step
    processes.append(start_runloop("--worker-id", "live", env=env()))
    live = worker_named("live")
    dead = worker_named("doomed")

    os.kill(doomed.pid, signal.SIGKILL)
    doomed.wait(timeout=30)
    killed_at = time.monotonic()
    done = wait_for(lambda: Step.objects.filter(task=task, state="done").first(), timeout=30)
    took = time.monotonic() - killed_at

    assert took < int(LEASE) / 2, f"took {took:.1f}s: the lease ran out, nobody settled it"
    runs = read_runs(log)
    assert [(r.attempt, r.end is None) for r in runs] == [(1, True), (2, False)]
    assert done.output["pid"] == runs[1].pid != runs[0].pid
    found = Event.objects.get(kind="worker_dead", data__worker=dead.pk)
    assert found.actor == f"worker:{live.pk}"  # the live peer, not a boot
    assert Event.objects.filter(kind="lease_released", task=task, actor=found.actor).exists()
    assert Worker.objects.get(pk=dead.pk).state == "dead"


def test_a_stopped_worker_on_the_same_host_is_never_settled(
    tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    log = tmp_path / "runs.log"
    task = cut_task(log, first_sleep=8)
    stopped = start_runloop("--worker-id", "stopped", env=env())
    processes.append(stopped)
    first_begun(log)
    processes.append(start_runloop("--worker-id", "peer", env=env()))
    worker_named("peer")
    held = worker_named("stopped")

    os.kill(stopped.pid, signal.SIGSTOP)
    try:
        # Its heartbeat goes stale (dead-after is 2 s) while its pid lives; the peer looks
        # every second and must leave it alone.
        wait_for(lambda: Worker.objects.get(pk=held.pk).last_seen < time_ago(4), timeout=30)
        time.sleep(3)
        assert Worker.objects.get(pk=held.pk).state == "running"
        assert Task.objects.get(pk=task.pk).lease_owner == held.pk
    finally:
        os.kill(stopped.pid, signal.SIGCONT)

    done = wait_for(lambda: Step.objects.filter(task=task, state="done").first(), timeout=60)
    assert [r.attempt for r in read_runs(log)] == [1]
    assert done.output["pid"] == stopped.pid
    assert not Event.objects.filter(kind="worker_dead").exists()


def test_a_stale_worker_on_another_host_is_settled_and_its_late_commit_refused(
    tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    log = tmp_path / "runs.log"
    out = tmp_path / "stale.out"
    task = cut_task(log, first_sleep=6)
    stale = start_runloop("--worker-id", "stale", env=env(LOOP_WORKER_HOST="elsewhere"), log=out)
    processes.append(stale)
    first_begun(log)
    processes.append(start_runloop("--worker-id", "peer", env=env()))
    peer = worker_named("peer")
    held = worker_named("stale")

    os.kill(stale.pid, signal.SIGSTOP)
    try:
        # No pid to look at on "another host": its heartbeat going stale settles it.
        done = wait_for(lambda: Step.objects.filter(task=task, state="done").first(), timeout=30)
    finally:
        os.kill(stale.pid, signal.SIGCONT)
    assert done.output["pid"] != stale.pid
    assert Event.objects.get(kind="worker_dead", data__worker=held.pk).actor == f"worker:{peer.pk}"

    # Resumed, it finishes its cut attempt; its verdict's commit is refused by the fence, and
    # it goes on as a new incarnation.
    wait_for(lambda: all(r.end is not None for r in read_runs(log)), timeout=30)
    reborn = wait_for(
        lambda: Event.objects.filter(kind="worker_started", data__declared_dead=held.pk).first(),
        timeout=30,
    )
    wait_for(lambda: "lease is now epoch" in out.read_text(), timeout=30)
    assert reborn.actor != f"worker:{held.pk}"
    step_row = Step.objects.get(task=task)
    assert step_row.state == "done" and step_row.attempts == 2
    assert step_row.output == done.output  # the stale attempt's result never landed
    assert Event.objects.filter(kind="step_done", step=step_row).count() == 1
    assert Task.objects.get(pk=task.pk).state == "done"
