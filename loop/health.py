"""What /healthz and the dashboard banner report, each reason while its condition lasts and
not a moment longer (DESIGN.md §8, §11).

    problems (503)   the database unreachable, writes failing, low disk, no worker alive, a
                     worker parked (low disk, the model endpoint down), a worker's write
                     failure that no write has cleared since
    degraded (200)   Redis unreachable (live updates paused; throttles count per process),
                     a worker whose heartbeat is late (frozen, partitioned, starved), a
                     worker whose clock is off the database's

Every time here is the database's (loop/clock.py): a worker's age is the database's now less
the heartbeat it wrote with that same clock.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.db.models import DateTimeField, Value
from django.db.models.functions import Now
from django.utils import timezone

from . import clock
from .models import HealthCheck, Worker, WorkerState


class _Rollback(Exception):
    pass


@dataclass
class Report:
    problems: list[str] = field(default_factory=list)
    degraded: list[str] = field(default_factory=list)
    workers: list[dict[str, Any]] = field(default_factory=list)

    @property
    def status(self) -> str:
        return "failing" if self.problems else "degraded" if self.degraded else "ok"

    def as_json(self) -> dict[str, Any]:
        return {
            "ok": not self.problems,
            "status": self.status,
            "problems": self.problems,
            "degraded": self.degraded,
            "workers": self.workers,
        }


def report() -> Report:
    """Every check; a check that fails says so as a problem, never as an exception."""
    found = Report()
    reached = database_problem()
    if reached:
        found.problems.append(reached)
    else:
        for check in (write_problem, low_disk_reason):
            try:
                reason = check()
            except Exception as exc:  # a check's own failure is a reason too
                reason = f"{check.__name__}: {type(exc).__name__}: {exc}"
            if reason:
                found.problems.append(reason)
        try:
            _workers(found)
        except DatabaseError as exc:
            found.problems.append(f"database unreachable: {first_line(exc)}")
    redis = redis_problem()
    if redis:
        found.degraded.append(redis)
    return found


def problems() -> list[str]:
    """What the dashboard's banner lists: the problems, then what is degraded."""
    found = report()
    return found.problems + found.degraded


# What Dad can do about each problem, in plain words (the banner shows it under the problem).
REMEDIES = [
    (
        "no worker is alive",
        "The loop is stopped: nothing runs and no answer is acted on. Run bin/up again, or "
        "restart the worker service (systemctl restart pippa-loop).",
    ),
    ("database unreachable", "Start the database server again; the loop goes on by itself."),
    ("writes failing", "Free disk space for the database (or fix its permissions)."),
    ("redis unreachable", "Start Redis again (systemctl start redis)."),
    ("low disk", "Free disk space in the data folder; the worker goes on by itself."),
    (" is parked", "Free disk space or fix what it reported; it goes on by itself."),
    (" is late", "Look at that worker's machine: it may be frozen, asleep or cut off."),
    ("clock is", "Fix that machine's clock (turn on NTP)."),
    ("model endpoint", "Check the model's server or its API key (LOOP_LLM_*)."),
]


def remedy(problem: str) -> str:
    """The remedy for a problem the banner lists, or ''."""
    return next((fix for words, fix in REMEDIES if words in problem), "")


def banner() -> list[tuple[str, str]]:
    """The banner's problems, each with its remedy."""
    return [(p, remedy(p)) for p in problems()]


def first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def database_problem() -> str:
    """'' when the database answers a statement; else why not."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except DatabaseError as exc:
        connection.close()  # a fresh connection at the next look
        return f"database unreachable: {first_line(exc)}"
    return ""


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


def _db_now() -> Any:
    """The database's time, read in the same statement as the rows it is compared with."""
    if clock.on_server():
        return Now()
    return Value(timezone.now(), output_field=DateTimeField())


def _workers(found: Report) -> None:
    """The live workers' rows, with the database's time read in the same statement."""
    rows = Worker.objects.filter(state__in=[WorkerState.RUNNING, WorkerState.PARKED]).annotate(
        db_time=_db_now()
    )
    alive = 0
    for worker in rows.order_by("pk"):
        seen = _seconds(worker.db_time, worker.last_seen)
        if seen <= settings.LOOP_WORKER_DEAD_AFTER:
            alive += 1
        found.workers.append(
            {
                "id": worker.pk,
                "name": str(worker),
                "state": worker.state,
                "seen_seconds_ago": round(seen, 1),
                "clock_skew_seconds": worker.clock_offset,
            }
        )
        if seen > settings.LOOP_WORKER_LATE_AFTER:
            found.degraded.append(
                f"{worker} is late: no heartbeat for {seen:.0f} s "
                f"(LOOP_WORKER_LATE_AFTER={settings.LOOP_WORKER_LATE_AFTER:g}): frozen, "
                "cut off from the database, or starved"
            )
            continue  # what it said before it fell silent is no news
        if worker.state == WorkerState.PARKED:
            found.problems.append(f"{worker} is parked: {worker.parked_reason}")
        if worker.last_error:
            found.problems.append(f"{worker} reported: {worker.last_error}")
        skew = worker.clock_offset
        if skew is not None and abs(skew) > settings.LOOP_CLOCK_SKEW_SECONDS:
            found.degraded.append(
                f"{worker}: its host's clock is {clock.described(skew)} "
                f"(LOOP_CLOCK_SKEW_SECONDS={settings.LOOP_CLOCK_SKEW_SECONDS:g}); leases and "
                "heartbeats use the database's clock"
            )
    if not alive:
        found.problems.insert(0, "no worker is alive")


def _seconds(now: datetime, then: datetime) -> float:
    if isinstance(now, str):  # SQLite hands back an annotated literal as text
        now = datetime.fromisoformat(now)
    if timezone.is_naive(now):
        now = now.replace(tzinfo=UTC)
    return max(0.0, (now - then).total_seconds())


def redis_problem() -> str:
    """'' without Redis or when it answers a PING within half a second; else why not."""
    if not settings.REDIS_URL:
        return ""
    import redis

    client = redis.Redis.from_url(
        settings.REDIS_URL, socket_connect_timeout=0.5, socket_timeout=0.5
    )
    try:
        client.ping()
    except (redis.RedisError, OSError) as exc:
        return (
            f"redis unreachable: {first_line(exc)} (live updates paused; login and token "
            "throttles count in each server process meanwhile)"
        )
    finally:
        client.close()
    return ""


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
