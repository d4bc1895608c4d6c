"""SQLite, where a writer waiting for the write lock gets its turn.

SQLite's busy handler sleeps between a waiting writer's tries (1, 2, 5, … then 100 ms at a
time). A worker running steps back to back holds the write lock for all but a few
microseconds between its commits, so a request that needs to write (a pause, an answer)
found it taken try after try: seconds (bench/big_tasks.py measured a p95 of 1-3 s).

Here every transaction's BEGIN says so while it waits, with a shared flock on the file
`<database>.turns`; and every BEGIN first lets such waiters go ahead: while one is waiting it
holds back (an exclusive flock it cannot get), for at most `HOLD_BACK_SECONDS` (longer than
the busy handler's longest sleep, so a waiter's next try finds the lock free). The locks live
in the kernel: a process that dies lets go of them. Only BEGIN takes part; nothing else
changes, and the busy timeout still bounds every wait.
"""

from __future__ import annotations

import fcntl
import os
import time

from django.db.backends.sqlite3 import base

HOLD_BACK_SECONDS = 0.2
POLL_SECONDS = 0.0002


class DatabaseWrapper(base.DatabaseWrapper):
    _turns: tuple[str, int] | None = None  # the turns file's name and descriptor

    def _turns_fd(self) -> int | None:
        if self.is_in_memory_db():
            return None
        name = f"{self.settings_dict['NAME']}.turns"
        if self._turns is not None and self._turns[0] != name:
            self._close_turns()  # the same wrapper on another database (the tests' one)
        if self._turns is None:
            self._turns = (name, os.open(name, os.O_RDWR | os.O_CREAT, 0o600))
        return self._turns[1]

    def _start_transaction_under_autocommit(self) -> None:
        fd = self._turns_fd()
        if fd is None:
            super()._start_transaction_under_autocommit()  # type: ignore[misc]
            return
        _let_waiters_go_first(fd)
        fcntl.flock(fd, fcntl.LOCK_SH)  # "I am waiting", while BEGIN waits
        try:
            super()._start_transaction_under_autocommit()  # type: ignore[misc]
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._close_turns()

    def _close_turns(self) -> None:
        if self._turns is not None:
            os.close(self._turns[1])
            self._turns = None


def _let_waiters_go_first(fd: int) -> None:
    """Return once no other connection is waiting in BEGIN, or after HOLD_BACK_SECONDS."""
    deadline: float | None = None
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            now = time.monotonic()
            if deadline is None:
                deadline = now + HOLD_BACK_SECONDS
            elif now >= deadline:
                return
            time.sleep(POLL_SECONDS)
            continue
        fcntl.flock(fd, fcntl.LOCK_UN)
        return
