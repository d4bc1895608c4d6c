from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import CommandError, CommandParser

from loop import prune
from loop.management.base import LoopCommand


class Command(LoopCommand):
    help = (
        "Delete finished tasks' history (events, effects, steps, the task) and API command "
        "receipts older than a window, in small batches. Never anything of an open task, "
        "never a receipt inside LOOP_RECEIPT_REPLAY_DAYS."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than",
            type=float,
            default=None,
            metavar="DAYS",
            help="the window in days (default: LOOP_PRUNE_AFTER_DAYS, else 90)",
        )
        parser.add_argument("--dry-run", action="store_true", help="print what would go")
        parser.add_argument("--batch", type=int, default=prune.BATCH, help="rows per transaction")

    def handle(self, *args: Any, **options: Any) -> None:
        days = options["older_than"]
        if days is None:
            days = settings.LOOP_PRUNE_AFTER_DAYS or 90
        if not 1 <= options["batch"] <= 10_000:
            raise CommandError("batch: must be between 1 and 10000")
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
