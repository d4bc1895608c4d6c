from __future__ import annotations

import getpass
from pathlib import Path
from typing import Any

from django.core.management.base import CommandError, CommandParser

from loop import actions, plans
from loop.management.base import LoopCommand


class Command(LoopCommand):
    help = "Create a task from a plan file (YAML or JSON); prints the new task's id."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", help="plan file, or - for standard input")

    def handle(self, *args: Any, **options: Any) -> None:
        name = options["file"]
        try:
            text = self.stdin.read() if name == "-" else Path(name).read_text()
        except OSError as exc:
            raise CommandError(f"{name}: {exc.strerror}") from None
        try:
            spec = plans.parse(text)
        except plans.PlanError as exc:
            raise CommandError("invalid plan:\n  " + "\n  ".join(exc.errors)) from None
        task = actions.create_task(plan=spec, actor=f"cli:{getpass.getuser()}")
        self.stdout.write(str(task.pk))

    @property
    def stdin(self) -> Any:
        import sys

        return sys.stdin
