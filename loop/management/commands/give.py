from __future__ import annotations

import getpass
from typing import Any

from django.core.management.base import CommandError, CommandParser

from loop import actions
from loop.management.base import LoopCommand
from loop.models import Task
from loop.permissions import SYSTEM


class Command(LoopCommand):
    help = "Let an agent drive a task over the API (an agent drives only its own tasks)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("task", type=int)
        parser.add_argument(
            "agent", nargs="?", default="", help="the agent's name (none: take it back)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if not Task.objects.filter(pk=options["task"]).exists():
            raise CommandError(f"task: no task {options['task']}")
        try:
            task = actions.give(
                task_id=options["task"],
                agent=options["agent"],
                actor=f"cli:{getpass.getuser()}",
                user=SYSTEM,
            )
        except actions.Refused as exc:
            raise CommandError(str(exc)) from None
        who = f"agent {task.driver}" if task.driver else "no agent"
        self.stdout.write(f"task {task.pk} is driven by {who}")
