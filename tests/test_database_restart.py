"""A database that drops every connection (a restart, a failover, an operator's
pg_terminate_backend) costs a running worker one failed write per thread, never its life: its
heartbeat comes back, so no peer takes it for dead and settles its work, and its ticks go on.
PostgreSQL's: a SQLite file has no server to drop a connection."""

from __future__ import annotations

import subprocess
import time

import pytest
from django.db import connection
from django.utils import timezone

from loop.models import Task, WorkerState
from loop.models import Worker as WorkerRow

from .conftest import make_task, process_env, start_runloop, step, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def drop_every_other_connection() -> int:
    """End every session on the test database but this test's own; how many."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return len(cursor.fetchall())


def test_a_worker_whose_connections_were_dropped_heartbeats_and_ticks_again(
    processes: list[subprocess.Popen[bytes]],
) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("a SQLite file has no server to drop a connection")
    env = process_env(LOOP_HEARTBEAT_SECONDS="1", LOOP_IDLE_SLEEP_MS="50")
    processes.append(start_runloop("--worker-id", "survivor", env=env))
    first = make_task(*(step(f"s{n}") for n in range(3)), title="before")
    wait_for(lambda: Task.objects.get(pk=first.pk).state == "done", timeout=60)
    worker = WorkerRow.objects.get(label="survivor")

    for _ in range(3):  # the heartbeat's connection and the loop's, whatever they were doing
        assert drop_every_other_connection() >= 1
        time.sleep(0.3)
    dropped_at = timezone.now()

    wait_for(
        lambda: WorkerRow.objects.get(pk=worker.pk).last_seen > dropped_at,
        timeout=15,  # a beat every second: the heartbeat's thread reconnected
    )
    after = make_task(*(step(f"s{n}") for n in range(3)), title="after")
    wait_for(lambda: Task.objects.get(pk=after.pk).state == "done", timeout=30)
    time.sleep(2.5)  # more beats: it keeps beating, not one lucky write
    row = WorkerRow.objects.get(pk=worker.pk)
    assert row.state == WorkerState.RUNNING
    assert (timezone.now() - row.last_seen).total_seconds() < 2.5
