"""/healthz (DESIGN.md §11): 503 with the reason while writes fail, space is low or no worker
is alive; 200 otherwise. A worker below LOOP_MIN_FREE_MB parks instead of claiming work."""

from __future__ import annotations

from typing import Any

from django.db import DatabaseError, connection
from django.test import Client

from loop import health
from loop.models import HealthCheck, Step, WorkerState
from loop.models import Worker as WorkerRow
from loop.worker import Worker

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
