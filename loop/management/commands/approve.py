from __future__ import annotations

import getpass
from typing import Any

from django.core.management.base import CommandError, CommandParser

from loop import actions, goals, questions
from loop.management.base import LoopCommand
from loop.models import Task
from loop.permissions import SYSTEM
from loop.tools.shown import as_text, terminal_safe


class Command(LoopCommand):
    help = (
        "Approve (or --decline) what Pippa or an agent proposed for a task: its steps, each "
        "side-effect call authorized exactly as shown."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("task", type=int)
        parser.add_argument("--decline", action="store_true", help="decline the proposal")
        parser.add_argument("--note", default="", help="why (with --decline)")

    def handle(self, *args: Any, **options: Any) -> None:
        task = Task.objects.filter(pk=options["task"]).first()
        if task is None:
            raise CommandError(f"task: no task {options['task']}")
        steps = goals.proposal(task)
        actor = f"cli:{getpass.getuser()}"  # the operator at the shell: a person
        try:
            if options["decline"]:
                task = actions.decline_plan(
                    task_id=task.pk, actor=actor, user=SYSTEM, note=options["note"]
                )
            else:
                task = actions.approve_plan(task_id=task.pk, actor=actor, user=SYSTEM)
        except actions.Refused as exc:
            raise CommandError(str(exc)) from None
        verb = "declined" if options["decline"] else "approved"
        self.stdout.write(f"task {task.pk} is now {task.state}; {verb}:")
        for step in steps:
            if step.judge != "tool":
                line = f"  {step.key}: a model step" + (
                    " (asks before each side effect)" if step.side_effect else ""
                )
                self.stdout.write(terminal_safe(line))
                continue
            call = questions.of_step(step)
            head = f"  {step.key}: {call.tool} → {call.target or '(no target)'}"
            self.stdout.write(terminal_safe(head + (f": {call.summary}" if call.summary else "")))
            for text in as_text(call.fields, indent="      "):
                self.stdout.write(text)
