from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandError, CommandParser

from loop.management.base import LoopCommand
from loop.models import Task
from loop.serialize import task_dict
from loop.tools.shown import Field, as_text, terminal_safe


class Command(LoopCommand):
    help = "Show a task with its steps, effects and questions."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("id", type=int)
        parser.add_argument("--json", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        task = Task.objects.filter(pk=options["id"]).first()
        if task is None:
            raise CommandError(f"id: no task {options['id']}")
        data = task_dict(task)
        if options["json"]:
            self.stdout.write(json.dumps(data, indent=2, default=str))
            return
        self.stdout.write(f"task {data['id']}: {data['title']} [{data['state']}]")
        origin = data["origin"]
        if origin["kind"] == "schedule":
            where = f"schedule {terminal_safe(origin.get('schedule', '?'))}, message {origin.get('message')}"
            self.stdout.write(f"  from {where}")
        for step in data["steps"]:
            self.stdout.write(
                f"  {step['id']:>6} {step['key']:<20} {step['state']:<8} "
                f"attempts {step['attempts']}/{step['max_attempts']}  {step['tool']}"
            )
            if step["error"]:
                self.stdout.write(f"         error: {step['error']}")
            if question := step["question"]:
                for line in question["text"].splitlines():
                    self.stdout.write(f"         ? {terminal_safe(line)}")
                # Each call it asks about, in full: what a person decides on.
                for call in [question["call"], *question["effects"]]:
                    if call:
                        head = f"{call['tool']} → {call['target'] or '(no target)'}"
                        self.stdout.write(f"           {terminal_safe(head)}")
                        view = [Field(**f) for f in call["request_view"]]
                        for line in as_text(view, indent="             "):
                            self.stdout.write(line)
            for effect in step["effects"]:
                self.stdout.write(
                    f"         effect {effect['id'][:12]} {effect['tool']} {effect['state']} "
                    f"{effect['target']}"
                )
