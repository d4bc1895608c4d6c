"""One clock (DESIGN.md §8, loop/clock.py): leases, heartbeats, retries and dead-after are
written and compared with the database server's clock, so a host whose clock is off neither
kills live peers nor keeps dead ones alive, nor takes a lease its holder still has.

On PostgreSQL, whose server has a clock of its own: in process (this test's host clock moved
with time_machine, the server's not) and with real workers, one of them under `faketime`
15 s ahead. On SQLite there is one host, whose clock is the database's: there the beat
records no skew."""

from __future__ import annotations

import logging
import subprocess
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import time_machine
from django.db import connection
from django.test import Client
from django.utils import timezone

from loop import boot, clock, lease
from loop.models import Event, EventKind, Task
from loop.models import Worker as WorkerRow
from loop.worker import Worker

from .conftest import make_task, process_env, start_runloop, step, wait_for
from .support.skew import skewed

on_postgres = pytest.mark.skipif(
    "postgres" not in str(connection.settings_dict.get("ENGINE", "")),
    reason="SQLite has no clock but its one host's",
)


def booted(label: str) -> Worker:
    runner = Worker(label=label)
    runner.boot()
    runner.beat()
    return runner


@on_postgres
def test_a_host_clock_far_ahead_neither_kills_live_peers_nor_takes_their_leases(
    db: None, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    settings.LOOP_WORKER_DEAD_AFTER = 10
    peer = booted("peer")
    task = make_task(step("a"))
    assert lease.claim(peer.worker_id) is not None  # the peer holds it, by the server's clock
    me = booted("ahead")
    with (
        time_machine.travel(timezone.now() + timedelta(minutes=5), tick=True),
        caplog.at_level(logging.WARNING, logger="loop.worker"),
    ):
        me.beat()  # measures this host against the server
        assert boot.dead_workers(exclude=me.worker_id) == []
        assert lease.claim(me.worker_id) is None  # the peer's lease has not run out
        assert not lease.any_claimable()
        assert abs(clock.skew() - 300) < 5
        assert abs(clock.now() - timezone.now() + timedelta(minutes=5)) < timedelta(seconds=5)
    assert "this host's clock is 300" in caplog.text and "ahead of the database's" in caplog.text
    row = WorkerRow.objects.get(pk=me.worker_id)
    assert row.clock_offset is not None and abs(row.clock_offset - 300) < 5
    assert Task.objects.get(pk=task.pk).lease_owner == peer.worker_id
    health = Client().get("/healthz").json()
    assert health["status"] == "degraded"
    assert any("ahead of the database's" in d and str(row) in d for d in health["degraded"])


@on_postgres
def test_a_host_clock_far_behind_still_finds_the_dead_and_the_due(db: None, settings: Any) -> None:
    settings.LOOP_WORKER_DEAD_AFTER = 10
    gone = booted("gone")  # on another machine, silent for a minute by the server's clock
    WorkerRow.objects.filter(pk=gone.worker_id).update(
        boot_id="another-kernel", last_seen=clock.db_now(-60)
    )
    make_task(step("a"))
    with time_machine.travel(timezone.now() - timedelta(minutes=5), tick=True):
        assert [w.pk for w in boot.dead_workers()] == [gone.worker_id]
        me = booted("behind")  # its boot settles the dead one
        assert WorkerRow.objects.get(pk=gone.worker_id).state == "dead"
        # A lease that ran out by the server's clock is free, whatever this host thinks.
        Task.objects.update(lease_owner=gone.worker_id, lease_until=clock.db_now(-1))
        assert lease.claim(me.worker_id) is not None


@on_postgres
def test_a_retry_is_due_by_the_servers_clock(db: None, settings: Any) -> None:
    settings.LOOP_RETRY_BASE_SECONDS = 2
    me = booted("behind")
    make_task(step("flaky", "test.flaky", args={"fail_first": 1}))
    with time_machine.travel(timezone.now() - timedelta(minutes=5), tick=True):
        me.beat()
        assert me.tick() is True  # the first try fails: a retry 2 s from now
        task = Task.objects.get()
        assert task.run_after is not None
        assert not lease.any_claimable()  # by this host's clock it was due long ago
    wait_for(lambda: lease.any_claimable(), timeout=10)


def test_on_sqlite_the_beat_records_no_skew(db: None) -> None:
    if clock.on_server():
        pytest.skip("SQLite's case")
    me = booted("here")
    assert WorkerRow.objects.get(pk=me.worker_id).clock_offset == 0.0


@on_postgres
@pytest.mark.slow
def test_a_worker_15_s_ahead_among_three_never_declares_a_live_peer_dead(
    transactional_db: None, tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    """The scene of issue 25: three workers, one whose clock runs 15 s ahead, a dead-after of
    3 s and slow steps. No one is declared dead, no step is started a second time."""
    env = process_env(
        LOOP_HEARTBEAT_SECONDS="1",
        LOOP_WORKER_DEAD_AFTER="3",
        LOOP_REAP_SECONDS="0.1",
        LOOP_LEASE_SECONDS="4",
        LOOP_IDLE_SLEEP_MS="20",
        LOOP_MIN_FREE_MB="0",
    )
    logs = [tmp_path / f"w{n}.log" for n in range(3)]
    # Each on a host of its own, so only heartbeats tell who is alive (as across machines).
    for n, label in enumerate(("on-time-1", "on-time-2", "ahead")):
        here = {**env, "LOOP_WORKER_HOST": f"host-{n}"}
        if label == "ahead":
            here = skewed(here, 15)
        processes.append(start_runloop("--worker-id", label, env=here, log=logs[n]))
    wait_for(lambda: WorkerRow.objects.filter(state="running").count() == 3, timeout=60)
    slow = {"log": str(tmp_path / "runs.log"), "sleep_ms": [300, 500]}
    for n in range(9):
        make_task(*(step(f"s{k}", "test.record", args=slow) for k in range(3)), title=f"{n}")
    began = time.monotonic()
    wait_for(lambda: not Task.objects.open().exists(), timeout=60)
    if time.monotonic() - began < 5:
        time.sleep(5 - (time.monotonic() - began))  # beats past the dead-after, all along

    assert not Event.objects.filter(kind=EventKind.WORKER_DEAD).exists()
    again = Event.objects.filter(kind__in=[EventKind.STEP_RESTARTED, EventKind.STEP_RETRY])
    assert not again.exists(), [(e.kind, e.actor, e.data) for e in again]
    assert not Event.objects.filter(kind=EventKind.LATE_RESULT).exists()
    off = WorkerRow.objects.get(label="ahead")
    assert off.clock_offset is not None and 13 < off.clock_offset < 17
    assert "ahead of the database's" in logs[2].read_text()
    health = Client().get("/healthz").json()
    assert [d for d in health["degraded"] if "clock" in d] == [
        f"{off}: its host's clock is {clock.described(off.clock_offset)} "
        "(LOOP_CLOCK_SKEW_SECONDS=2); leases and heartbeats use the database's clock"
    ]


def test_a_reaper_whose_own_link_just_came_back_judges_no_peer_by_its_heartbeat(
    db: None, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database restart stops every worker's beat alike: the first one back must not take
    its peers, cut off as it was, for dead. It waits until its own link has held for
    LOOP_WORKER_DEAD_AFTER (live peers beat again meanwhile); a dead peer is settled then."""
    from django.db import OperationalError

    from loop import sql

    settings.LOOP_WORKER_DEAD_AFTER = 10
    me = booted("me")
    peer = booted("peer")  # on another machine, its last beat 30 s ago by the server's clock
    WorkerRow.objects.filter(pk=peer.worker_id).update(
        boot_id="another-kernel", last_seen=clock.db_now(-30)
    )
    real_beat = sql.beat

    def restarting(*args: Any, **kwargs: Any) -> Any:
        raise OperationalError("terminating connection due to administrator command")

    monkeypatch.setattr(sql, "beat", restarting)
    me.beat()  # the outage, as this worker sees it
    assert me.reap() == {"workers": 0, "effects": 0, "leases": 0}
    monkeypatch.setattr(sql, "beat", real_beat)
    me.beat()  # back
    assert me.reap()["workers"] == 0
    assert WorkerRow.objects.get(pk=peer.worker_id).state != "dead"
    assert me._link_since is not None
    me._link_since -= settings.LOOP_WORKER_DEAD_AFTER  # its link has held that long since
    assert me.reap()["workers"] == 1
    assert WorkerRow.objects.get(pk=peer.worker_id).state == "dead"


def test_a_worker_s_link_counts_from_its_registration(db: None, settings: Any) -> None:
    """A worker's boot wrote its row over the link: the link has held since then, not since its
    first heartbeat (LOOP_HEARTBEAT_SECONDS later), so a worker started just before a peer died
    settles it LOOP_WORKER_DEAD_AFTER after both, not a heartbeat's period later."""
    settings.LOOP_WORKER_DEAD_AFTER = 10
    me = booted("me")
    peer = booted("peer")
    WorkerRow.objects.filter(pk=peer.worker_id).update(
        boot_id="another-kernel", last_seen=clock.db_now(-30)
    )
    assert me.reap()["workers"] == 0  # just registered: its link has not held 10 s yet
    assert me._link_since is not None
    me._link_since -= settings.LOOP_WORKER_DEAD_AFTER  # no beat of its own since
    assert me.reap()["workers"] == 1
