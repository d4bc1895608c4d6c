"""The base of our management commands: a command that could not do what it was asked exits
non-zero with the reason on stderr (DESIGN.md §13), never a traceback for an expected error."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError


class LoopCommand(BaseCommand):
    def execute(self, *args: Any, **options: Any) -> str | None:
        """A database that refuses (a full disk, a read-only file, a lost server) is an
        expected error: `CommandError` with its reason, so exit status 1 without a traceback
        (`--traceback` shows it)."""
        try:
            return super().execute(*args, **options)
        except DatabaseError as exc:
            if options.get("traceback"):
                raise
            raise CommandError(f"database: {type(exc).__name__}: {exc}") from None
