from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandParser

from loop.management.base import LoopCommand
from loop.models import Task
from loop.serialize import task_summary


class Command(LoopCommand):
    help = "List tasks."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        tasks = Task.objects.order_by("id")
        if options["json"]:
            self.stdout.write(json.dumps([task_summary(t) for t in tasks], indent=2))
            return
        for task in tasks:
            done = task.steps.filter(state="done").count()
            total = task.steps.count()
            self.stdout.write(f"{task.pk:>6}  {task.state:<10} {done}/{total}  {task.title}")
