"""The heartbeat renews the lease of the step in flight, and warns only when that step really
lost its lease, not when the step merely committed while the beat was renewing."""

from __future__ import annotations

import logging
import time

import pytest

from loop import lease
from loop.models import Task
from loop.models import Worker as WorkerRow
from loop.step_life import Started
from loop.worker import Worker

from .conftest import claim_and_start, make_task, step


def start_one(worker: Worker) -> Started:
    make_task(step("a"))
    started = claim_and_start(worker)
    worker.in_flight, worker.in_flight_since = [started], time.monotonic()
    return started


def test_the_beat_renews_the_lease_of_the_step_in_flight(worker: Worker) -> None:
    started = start_one(worker)
    Task.objects.filter(pk=started.task_id).update(lease_until=None)
    worker.beat()
    assert Task.objects.get(pk=started.task_id).lease_until is not None


def test_a_lease_lost_mid_step_is_reported(
    worker: Worker, caplog: pytest.LogCaptureFixture
) -> None:
    started = start_one(worker)
    Task.objects.filter(pk=started.task_id).update(lease_epoch=started.epoch + 1)
    with caplog.at_level(logging.WARNING, logger="loop.worker"):
        worker.beat()
    assert "lease moved on while its step ran" in caplog.text


def test_a_step_that_committed_during_the_beat_is_no_lost_lease(
    worker: Worker, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    start_one(worker)

    def renew_after_the_commit(*args: object, **kwargs: object) -> bool:
        worker.in_flight = []  # the tick committed the verdict and released the lease
        return False

    monkeypatch.setattr(lease, "renew", renew_after_the_commit)
    with caplog.at_level(logging.WARNING, logger="loop.worker"):
        worker.beat()
    assert "lease moved on" not in caplog.text


def test_a_tick_that_breaks_does_not_kill_the_worker(worker: Worker, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    calls = []

    def broken() -> bool:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a bug in a tick")
        worker.stopping = True
        return False

    monkeypatch.setattr(worker, "boot", lambda: {})
    monkeypatch.setattr(worker, "_install_signals", lambda: None)
    monkeypatch.setattr(worker, "tick", broken)
    monkeypatch.setattr("loop.worker.drop_broken_connections", lambda: None)  # the test's own
    worker.run()  # returns once the second tick asks it to stop
    assert len(calls) == 2
    worker.beat()
    assert "a bug in a tick" in WorkerRow.objects.get(pk=worker.worker_id).last_error
