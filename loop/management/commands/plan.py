from __future__ import annotations

import getpass
from pathlib import Path
from typing import Any

from django.core.management.base import CommandError, CommandParser

from loop import actions, plans, schedules
from loop.management.base import LoopCommand
from loop.permissions import SYSTEM


class Command(LoopCommand):
    help = (
        "Create a task from a plan file (YAML or JSON); prints the new task's id. A plan with "
        "'schedule' creates a schedule instead and prints its name. With --goal, a task Pippa "
        "plans (the model writes its steps; needs LOOP_LLM_BASE_URL)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", nargs="?", help="plan file, or - for standard input")
        parser.add_argument("--goal", help="instead of a file: the task's goal in words")
        parser.add_argument("--title", help="with --goal: the task's title (default: the goal)")

    def handle(self, *args: Any, **options: Any) -> None:
        name, goal = options["file"], options["goal"]
        if (name is None) == (goal is None):
            raise CommandError("give a plan file or --goal TEXT (one of them)")
        actor = f"cli:{getpass.getuser()}"
        if goal is not None:
            try:
                task = actions.create_task_from_goal(
                    goal=goal, title=options["title"], actor=actor, user=SYSTEM
                )
            except plans.PlanError as exc:
                raise CommandError("invalid goal:\n  " + "\n  ".join(exc.errors)) from None
            self.stdout.write(str(task.pk))
            return
        if options["title"] is not None:
            raise CommandError("--title: only with --goal (a plan file has its own title)")
        # Bytes, one past the limit at most: plans.parse decodes (UTF-8) and refuses the rest.
        enough = plans.max_bytes() + 1
        try:
            if name == "-":
                raw = self.stdin.buffer.read(enough)
            else:
                with Path(name).open("rb") as handle:
                    raw = handle.read(enough)
        except OSError as exc:
            raise CommandError(f"{name}: {exc.strerror}") from None
        try:
            spec = plans.parse(raw)
        except plans.PlanError as exc:
            raise CommandError("invalid plan:\n  " + "\n  ".join(exc.errors)) from None
        if spec.schedule is not None:
            try:
                schedule = schedules.create(spec=spec, actor=actor, user=SYSTEM)
            except actions.Refused as exc:
                raise CommandError(str(exc)) from None
            self.stdout.write(schedule.name)
            return
        task = actions.create_task(plan=spec, actor=actor, user=SYSTEM)
        self.stdout.write(str(task.pk))

    @property
    def stdin(self) -> Any:
        import sys

        return sys.stdin
