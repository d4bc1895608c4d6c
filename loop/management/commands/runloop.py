from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from loop.management.base import LoopCommand, whole_number
from loop.worker import Worker


def label(value: str) -> str:
    if (
        not value
        or len(value) > 100
        or not value.replace("-", "").replace("_", "").replace(".", "").isalnum()
    ):
        raise ValueError("a worker id is 1-100 letters, digits, '-', '_' or '.'")
    return value


batch = whole_number("batch", low=1, high=256)  # tasks moved per commit


class Command(LoopCommand):
    help = "Run the loop: boot reconciliation, then claim and run steps until signalled."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--once",
            action="store_true",
            help="reconcile, fire due schedules, at most one tick, exit",
        )
        parser.add_argument("--worker-id", type=label, default=None, help="a label for this worker")
        parser.add_argument(
            "--batch", type=batch, default=None, help="tasks moved per commit (LOOP_BATCH)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        worker = Worker(
            label=options["worker_id"] or "", once=options["once"], batch=options["batch"]
        )
        failed = worker.run()
        if failed and options["once"]:
            raise CommandError(f"--once: the tick failed: {failed}")
