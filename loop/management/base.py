"""The base of our management commands: a command that could not do what it was asked exits
non-zero with the reason on stderr (DESIGN.md §13), never a traceback for an expected error."""

from __future__ import annotations

import os
import signal
import sys
from argparse import ArgumentTypeError
from collections.abc import Callable
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from loop import numbers

MAX_ID = 2**63 - 1  # the largest row id a database column holds


def whole_number(what: str, *, low: int = 0, high: int = MAX_ID) -> Callable[[str], int]:
    """An argparse `type=`: a whole number in ASCII digits within [low, high] (`loop.numbers`;
    int() would take '١٢', and a number past a row id's range reached the database)."""

    def parse(raw: str) -> int:
        try:
            return numbers.whole(raw, what, low=low, high=high)
        except numbers.NotANumber as exc:
            raise ArgumentTypeError(str(exc)) from None

    return parse


class LoopCommand(BaseCommand):
    # The loop's commands serve no URLs, and Django's system checks would import the whole
    # HTTP API (django-ninja) for the URL checks: most of a second before `manage.py task 3`
    # prints anything, or before a worker heartbeats. `manage.py check` and `migrate` run them.
    requires_system_checks: list[str] = []

    def execute(self, *args: Any, **options: Any) -> str | None:
        """A database that refuses (a full disk, a read-only file, a lost server) is an
        expected error: `CommandError` with its reason, so exit status 1 without a traceback
        (`--traceback` shows it). A reader that stops reading (`task 3 | head`) ends the
        command as SIGPIPE ends other tools: quietly, status 141."""
        try:
            result = super().execute(*args, **options)
            sys.stdout.flush()  # a buffered pipe's last write fails here, not at exit
            return result
        except BrokenPipeError:
            # Nothing more can be written; point stdout at /dev/null so the exit's own flush
            # does not fail again.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise SystemExit(128 + signal.SIGPIPE) from None
        except DatabaseError as exc:
            if options.get("traceback"):
                raise
            raise CommandError(f"database: {type(exc).__name__}: {exc}") from None
