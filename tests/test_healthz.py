"""/healthz (DESIGN.md §8, §11): JSON in every state; 503 with each reason while the database
is unreachable, writes fail, space is low, no worker is alive or the model endpoint is down;
200 otherwise, "degraded" naming a late worker, one whose clock is off, or Redis down (see
tests/test_degraded.py, tests/test_one_clock.py). Each reason goes as soon as its condition
does. A worker below LOOP_MIN_FREE_MB parks instead of claiming work."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import DatabaseError, OperationalError, connection
from django.test import Client

from loop import clock, health, lease, llm
from loop.models import HealthCheck, Step, WorkerState
from loop.models import Worker as WorkerRow
from loop.worker import TickFailed, Worker

from .conftest import make_task, step


def problems(client: Client, status: int) -> list[str]:
    response = client.get("/healthz")
    assert response.status_code == status, response.content
    found: list[str] = response.json()["problems"]
    assert response.json()["ok"] is (status == 200)
    return found


def test_healthz_is_200_while_a_worker_is_alive_and_writes_work(db: None, settings: Any) -> None:
    settings.LOOP_MIN_FREE_MB = 0
    Worker(label="alive").boot()
    assert problems(Client(), 200) == []


def test_healthz_is_503_when_no_worker_is_alive(db: None, settings: Any) -> None:
    settings.LOOP_MIN_FREE_MB = 0
    assert problems(Client(), 503) == ["no worker is alive"]
    gone = Worker(label="gone")
    gone.boot()
    WorkerRow.objects.filter(pk=gone.worker_id).update(state=WorkerState.STOPPED)
    assert problems(Client(), 503) == ["no worker is alive"]


def test_a_worker_parks_on_low_disk_and_healthz_says_why_until_room_returns(
    db: None, settings: Any
) -> None:
    task = make_task(step("a"))
    worker = Worker(label="cramped")
    worker.boot()
    settings.LOOP_MIN_FREE_MB = 10**12  # more than any disk has

    assert worker.tick() is False  # parked: no claim
    row = WorkerRow.objects.get(pk=worker.worker_id)
    assert row.state == WorkerState.PARKED and row.parked_reason.startswith("low disk")
    assert Step.objects.get(task=task).state == "pending"
    found = problems(Client(), 503)
    assert any(p.startswith("low disk") for p in found)
    assert any("is parked: low disk" in p for p in found)

    settings.LOOP_MIN_FREE_MB = 0
    assert worker.tick() is True
    assert WorkerRow.objects.get(pk=worker.worker_id).state == WorkerState.RUNNING
    assert Step.objects.get(task=task).state == "done"
    assert problems(Client(), 200) == []


def test_healthz_answers_only_get(db: None) -> None:
    assert Client().post("/healthz").status_code == 405


def test_a_failed_write_says_whose_disk_to_watch(db: None, settings: Any, monkeypatch: Any) -> None:
    """On PostgreSQL the loop cannot see the server's disk: the reason says it is the
    operator's to watch; on SQLite it measures the file's own folder, and says nothing more."""
    settings.LOOP_MIN_FREE_MB = 0
    Worker(label="alive").boot()

    def full(*args: Any, **kwargs: Any) -> None:
        raise DatabaseError("could not extend file: No space left on device")

    monkeypatch.setattr(HealthCheck.objects, "create", full)
    [reason] = problems(Client(), 503)
    assert reason.startswith("writes failing: could not extend file: No space left on device")
    if connection.vendor == "sqlite":
        assert reason.endswith("device")
    else:
        assert reason.endswith(health.DATABASE_DISK) and "operator's to watch" in reason


def test_a_late_worker_is_named_as_degraded_and_no_longer_once_it_beats(
    db: None, settings: Any
) -> None:
    settings.LOOP_MIN_FREE_MB = 0
    settings.LOOP_WORKER_LATE_AFTER = 5
    Worker(label="alive").boot()
    frozen = Worker(label="frozen")  # its pid lives (this process): never dead, only late
    frozen.boot()
    WorkerRow.objects.filter(pk=frozen.worker_id).update(last_seen=clock.db_now(-8))
    response = Client().get("/healthz")
    assert response.status_code == 200 and response.json()["status"] == "degraded"
    [late] = response.json()["degraded"]
    assert (
        late.startswith(f"worker {frozen.worker_id} (frozen:")
        and "is late: no heartbeat for 8 s" in late
    )
    frozen.beat()
    body = Client().get("/healthz").json()
    assert body["status"] == "ok" and body["degraded"] == []


def test_the_model_endpoint_down_is_a_reason_until_it_answers(
    db: None, settings: Any, monkeypatch: Any
) -> None:
    settings.LOOP_MIN_FREE_MB = 0
    worker = Worker(label="thinker")
    worker.boot()
    monkeypatch.setattr(llm, "outage", lambda: "model endpoint down: connection refused")
    assert worker.tick() is False  # parked
    assert problems(Client(), 503) == [
        f"{WorkerRow.objects.get(pk=worker.worker_id)} is parked: model endpoint down: connection refused"
    ]
    monkeypatch.setattr(llm, "outage", lambda: "")
    worker.tick()
    assert problems(Client(), 200) == []


def test_a_workers_write_failure_is_cleared_by_its_next_write_not_minutes_later(
    db: None, settings: Any, monkeypatch: Any
) -> None:
    settings.LOOP_MIN_FREE_MB = 0
    worker = Worker(label="writer")
    worker.boot()
    make_task(step("a"))

    def gone() -> bool:
        raise OperationalError("server closed the connection unexpectedly")

    with monkeypatch.context() as patch:
        patch.setattr(lease, "any_claimable", gone)
        with pytest.raises(TickFailed):
            worker.tick()
    worker.beat()
    [reported] = problems(Client(), 503)
    assert "reported: write failed in claiming a task: OperationalError" in reported
    assert worker.tick() is True  # the database answers again, and the step is done
    worker.beat()
    assert problems(Client(), 200) == []


def test_healthz_in_each_state_is_json(db: None, settings: Any, monkeypatch: Any) -> None:
    """All clear: every key a probe reads."""
    settings.LOOP_MIN_FREE_MB = 0
    Worker(label="alive").boot()
    body = Client().get("/healthz").json()
    assert body["ok"] is True and body["status"] == "ok"
    assert body["problems"] == [] and body["degraded"] == []
    [worker] = body["workers"]
    assert worker["state"] == "running" and worker["seen_seconds_ago"] < 5
