"""What /healthz and the dashboard banner report: can we write, is there room, is a worker
alive?"""

from __future__ import annotations

import shutil
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from .models import HealthCheck, Worker, WorkerState


class _Rollback(Exception):
    pass


def write_problem() -> str:
    """Insert a row big enough to need fresh pages, then roll it back: '' if that worked."""
    try:
        with transaction.atomic():
            HealthCheck.objects.create(payload=b"\0" * 65536)
            raise _Rollback
    except _Rollback:
        return ""
    except DatabaseError as exc:
        return f"writes failing: {exc}{DATABASE_DISK if connection.vendor != 'sqlite' else ''}"


# On a database server the loop cannot see the server's disk (PostgreSQL reports no free
# space to a client): watching it is the operator's job, and a failed write says so.
DATABASE_DISK = (
    " (the database server's own disk is the operator's to watch: the loop cannot measure it; "
    "LOOP_MIN_FREE_MB guards only this host's data folder)"
)


def problems() -> list[str]:
    found = [p for p in (write_problem(), low_disk_reason()) if p]
    alive_since = timezone.now() - timedelta(seconds=settings.LOOP_WORKER_DEAD_AFTER)
    workers = Worker.objects.filter(
        state__in=[WorkerState.RUNNING, WorkerState.PARKED], last_seen__gte=alive_since
    )
    if not workers.exists():
        found.append("no worker is alive")
    for worker in workers.filter(state=WorkerState.PARKED):
        found.append(f"{worker} is parked: {worker.parked_reason}")
    recent = timezone.now() - timedelta(minutes=5)
    for worker in workers.filter(last_error_at__gte=recent):
        found.append(f"{worker} reported: {worker.last_error}")
    return found


def low_disk_reason() -> str:
    """Why new work should wait for room, or ''. On SQLite the database's own folder; on a
    database server (whose disk a worker cannot see: `DATABASE_DISK`) the worker's local
    data folder."""
    if connection.vendor == "sqlite":
        folder = Path(str(settings.DATABASES["default"]["NAME"])).parent
    else:
        folder = Path(settings.DATA_DIR)
    free_mb = shutil.disk_usage(folder).free // (1024 * 1024)
    if free_mb < settings.LOOP_MIN_FREE_MB:
        return f"low disk: {free_mb} MB free under {folder}, below LOOP_MIN_FREE_MB={settings.LOOP_MIN_FREE_MB}"
    return ""
