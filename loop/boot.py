"""Boot reconciliation (DESIGN.md §9): before a worker's first claim, the effects of dead
workers are settled and their leases released. A live worker's work is never touched."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.db.models import BooleanField, ExpressionWrapper, Q

from . import clock, effects, journal, lease
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


@dataclass(frozen=True)
class Machine:
    """Whose process table a pid belongs to (DESIGN.md §9): not the host name alone, which
    containers and clones share, but the running kernel (its boot id) and the pid namespace.
    Either is '' when this process cannot tell; then no peer reads its pid."""

    host: str
    boot_id: str
    pid_ns: str

    def reads_pids_of(self, worker: Worker) -> bool:
        """Whether this machine's process table is `worker`'s: only then does a missing pid
        mean it died. Anywhere else only its heartbeat tells."""
        return bool(self.boot_id and self.pid_ns) and (
            (worker.host, worker.boot_id, worker.pid_ns) == (self.host, self.boot_id, self.pid_ns)
        )


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def pid_namespace() -> str:
    """This process's pid namespace ('pid:[4026531836]'), or '' when /proc is not its
    namespace's (`unshare --pid` without `--mount-proc`: /proc/<pid> would name another
    process), or cannot be read."""
    try:
        if os.readlink("/proc/self") != str(os.getpid()):
            return ""
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def this_machine() -> Machine:
    return Machine(host_name(), _read("/proc/sys/kernel/random/boot_id"), pid_namespace())


def dead_workers(*, exclude: int | None = None, by_heartbeat: bool = True) -> list[Worker]:
    """Workers that are gone. On this machine (`Machine.reads_pids_of`) the process table
    decides: dead when the pid is gone (at once), never while it lives (a stopped or stuck
    process keeps its leases until they run out). Anywhere else: a heartbeat older than
    LOOP_WORKER_DEAD_AFTER by the database's clock (loop/clock.py), so a host whose clock is
    off neither kills live peers nor keeps dead ones alive. A worker that still heartbeats
    is never among them. `by_heartbeat=False`: the process table only (a reaper whose own link
    to the database has just come back cannot tell a dead peer from one cut off as it was)."""
    machine = this_machine()
    stale = ExpressionWrapper(
        Q(last_seen__lt=clock.db_now(-settings.LOOP_WORKER_DEAD_AFTER)),
        output_field=BooleanField(),
    )
    dead: list[Worker] = []
    alive = Worker.objects.filter(state__in=[WorkerState.RUNNING, WorkerState.PARKED])
    for worker in alive.annotate(stale=stale):
        if worker.pk == exclude:
            continue
        if machine.reads_pids_of(worker):
            gone = not pid_alive(worker.pid, worker.pid_started)
        else:
            gone = by_heartbeat and bool(worker.stale)
        if gone:
            dead.append(worker)
    return dead


def reconcile(
    *, actor: str, exclude: int | None = None, by_heartbeat: bool = True
) -> dict[str, int]:
    """Settle the effects and release the leases of dead workers; a live worker's work is
    never touched. Each decision is journaled. Run at boot, by `manage.py reconcile`, and
    every LOOP_REAP_SECONDS by each live worker (`exclude` is then itself)."""
    counts = {"workers": 0, "effects": 0, "leases": 0}
    for worker in dead_workers(exclude=exclude, by_heartbeat=by_heartbeat):
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
