from __future__ import annotations

from argparse import ArgumentTypeError
from typing import Any

from django.conf import settings
from django.core.management.base import CommandError, CommandParser

from loop import numbers, prune
from loop.management.base import LoopCommand, whole_number


class Command(LoopCommand):
    help = (
        "Delete finished tasks' history (events, effects, steps, the task) and API command "
        "receipts older than a window, in small batches. Never anything of an open task, "
        "never a receipt inside LOOP_RECEIPT_REPLAY_DAYS."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than",
            type=days,
            default=None,
            metavar="DAYS",
            help="the window in days (default: LOOP_PRUNE_AFTER_DAYS, else 90)",
        )
        parser.add_argument("--dry-run", action="store_true", help="print what would go")
        parser.add_argument(
            "--batch",
            type=whole_number("batch", low=1, high=10_000),
            default=prune.BATCH,
            help="rows per transaction",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        days = options["older_than"]
        if days is None:
            days = settings.LOOP_PRUNE_AFTER_DAYS or 90
        try:
            window = prune.Window.of(days)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        if options["dry_run"]:
            found = prune.counts(window)
            verb = "would delete"
        else:
            found = prune.prune(window, limit=options["batch"])
            verb = "deleted"
        for table in prune.TABLES:
            self.stdout.write(f"{table}: {verb} {found[table]}")


def days(raw: str) -> float:
    """`--older-than`: a number of days in ASCII digits (`loop.numbers`: no nan, inf or 1e308)."""
    try:
        return numbers.number(raw, "older-than", low=0, high=prune.MAX_DAYS)
    except numbers.NotANumber:
        raise ArgumentTypeError(
            f"older-than: must be a number of days from 0 to {prune.MAX_DAYS}, not {raw!r}"
        ) from None
