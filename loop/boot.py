"""Boot reconciliation (DESIGN.md §9): before a worker's first claim, the effects of dead
workers are settled and their leases released. A live worker's work is never touched."""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from . import effects, journal, lease
from .models import EventKind, Task, Worker, WorkerState


def proc_start_time(pid: int) -> str:
    """The kernel's start time of `pid` (field 22 of /proc/pid/stat), '' if unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[19]


def pid_alive(pid: int, started: str) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not started or proc_start_time(pid) == started


def host_name() -> str:
    """The host this process records and compares: LOOP_WORKER_HOST, else the real one."""
    return settings.LOOP_WORKER_HOST or socket.gethostname()


def dead_workers(*, exclude: int | None = None) -> list[Worker]:
    """Workers that are gone. On this host the process table decides: dead when the pid is
    gone (at once), never while it lives (a stopped or stuck process keeps its leases until
    they run out). On another host: a heartbeat older than LOOP_WORKER_DEAD_AFTER. A worker
    that still heartbeats is never among them."""
    host = host_name()
    stale = timezone.now() - timedelta(seconds=settings.LOOP_WORKER_DEAD_AFTER)
    dead = []
    for worker in Worker.objects.filter(state__in=[WorkerState.RUNNING, WorkerState.PARKED]):
        if worker.pk == exclude:
            continue
        if worker.host == host:
            gone = not pid_alive(worker.pid, worker.pid_started)
        else:
            gone = worker.last_seen < stale
        if gone:
            dead.append(worker)
    return dead


def reconcile(*, actor: str, exclude: int | None = None) -> dict[str, int]:
    """Settle the effects and release the leases of dead workers; a live worker's work is
    never touched. Each decision is journaled. Run at boot, by `manage.py reconcile`, and
    every LOOP_REAP_SECONDS by each live worker (`exclude` is then itself)."""
    counts = {"workers": 0, "effects": 0, "leases": 0}
    for worker in dead_workers(exclude=exclude):
        with transaction.atomic():
            # Only as found: another reaper got there first, or it heartbeated meanwhile.
            if not Worker.objects.filter(
                pk=worker.pk, state=worker.state, last_seen=worker.last_seen
            ).update(state=WorkerState.DEAD):
                continue
            journal.record(EventKind.WORKER_DEAD, actor=actor, worker=worker.pk, pid=worker.pid)
            counts["workers"] += 1
            counts["effects"] += effects.retire_dead([worker.pk], actor=actor)
            for task in Task.objects.filter(lease_owner=worker.pk):
                lease.release(task)
                journal.record(EventKind.LEASE_RELEASED, task=task, actor=actor, worker=worker.pk)
                counts["leases"] += 1
    return counts
