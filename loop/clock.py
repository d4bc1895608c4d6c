"""One clock (DESIGN.md §8): every lease, heartbeat, retry-due and dead-after time is written
and compared with the database server's clock, never a host's, so a host whose clock is off
neither kills live peers nor keeps dead ones alive.

    PostgreSQL   the statements that write and compare those times say `statement_timestamp()`
                 themselves (`sql.py`'s claims, `db_now()` in the ORM's updates and filters):
                 the host's clock never enters them.
    SQLite       one host, whose clock is the database's: the statements take this process's
                 time as a parameter, as they always did.

What a process must still compare or write in Python — the claims of a step's effects when
its new holder starts it, a retry's time shown on the step, the time written beside a journal
event — is `now()`: this host's clock corrected by its skew from the database's, as last
measured (a worker measures at every heartbeat, in the beat's own statement: `note`; another
process measures when its measure is a minute old, outside any transaction). A worker whose
clock is off by more than LOOP_CLOCK_SKEW_SECONDS says so in its log and on /healthz.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError, connection
from django.db.models import DurationField, Value
from django.db.models.functions import Now
from django.utils import timezone

REMEASURE_SECONDS = 60.0

_skew = 0.0  # seconds: this host's clock minus the database's (positive: ahead)
_measured_at = -REMEASURE_SECONDS  # time.monotonic() of the last measure


def on_server() -> bool:
    """Whether the database has a clock of its own (PostgreSQL), not this host's (SQLite)."""
    return connection.vendor == "postgresql"


def skew() -> float:
    """This host's clock minus the database's, in seconds, as last measured (0 on SQLite)."""
    return _skew


def now() -> datetime:
    """The database's time now, as this host can tell it: its own clock less its skew."""
    if on_server() and time.monotonic() - _measured_at > REMEASURE_SECONDS:
        measure()
    return timezone.now() - timedelta(seconds=_skew)


def db_now(plus: float = 0.0) -> Any:
    """The database's time now (+ `plus` seconds) for an ORM update or filter: on PostgreSQL
    the expression `statement_timestamp()`, evaluated by the server; on SQLite this host's
    time, which is the database's."""
    if not on_server():
        return timezone.now() + timedelta(seconds=plus)
    if not plus:
        return Now()
    return Now() + Value(timedelta(seconds=plus), output_field=DurationField())


def note(db_time: datetime, sent: float, received: float) -> float:
    """Record the database's time as a statement sent at `sent` and answered at `received`
    (this host's `time.time()`) read it; the new skew."""
    global _skew, _measured_at
    _skew = (sent + received) / 2 - db_time.timestamp()
    _measured_at = time.monotonic()
    return _skew


def measure() -> float:
    """Ask the database its time (one statement; never inside a transaction, whose failure it
    would poison: then the last measure stands). The skew."""
    global _measured_at
    if not on_server() or connection.in_atomic_block:
        return _skew
    _measured_at = time.monotonic()  # a failure is not retried at once
    try:
        with connection.cursor() as cursor:
            sent = time.time()
            cursor.execute("SELECT statement_timestamp()")
            (db_time,) = cursor.fetchone()
            return note(db_time, sent, time.time())
    except DatabaseError:
        return _skew


def forget() -> None:
    """Drop the measure: the next `now()` on a database server measures afresh (tests, whose
    time travel ends where a process's clock would not jump back)."""
    global _skew, _measured_at
    _skew, _measured_at = 0.0, -REMEASURE_SECONDS


def described(seconds: float) -> str:
    """A skew in words: '12.3 s ahead of the database's' / '… behind …'."""
    return f"{abs(seconds):.1f} s {'ahead of' if seconds > 0 else 'behind'} the database's"
