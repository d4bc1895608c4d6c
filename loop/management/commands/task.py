from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandError, CommandParser

from loop import questions
from loop.management.base import LoopCommand, whole_number
from loop.models import Effect, StepState, Task
from loop.serialize import task_dict
from loop.tools.shown import as_text, terminal_safe


class Command(LoopCommand):
    help = "Show a task with its steps, effects and questions."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("id", type=whole_number("id"))
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
        asked_of = blocked_questions(task)
        origin = data["origin"]
        if origin["kind"] == "schedule":
            where = f"schedule {terminal_safe(origin.get('schedule', '?'))}, message {origin.get('message')}"
            self.stdout.write(f"  from {where}")
        if data["driver"]:
            self.stdout.write(f"  driven by agent {terminal_safe(data['driver'])}")
        if data["waits_for_approval"]:
            self.stdout.write("  waits for a person to approve the steps marked 'proposed'")
        for step in data["steps"]:
            writer = step["written_by"]
            self.stdout.write(
                f"  {step['id']:>6} {step['key']:<20} {step['state']:<8} "
                f"attempts {step['attempts']}/{step['max_attempts']}  {step['tool']}"
                f"  by {writer['kind']} {terminal_safe(writer['name'])}"
                + ("  proposed" if step["proposed"] else "")
            )
            if step["error"]:
                self.stdout.write(f"         error: {step['error']}")
            if asked := asked_of.get(step["id"]):
                self.write_question(asked)
            for effect in step["effects"]:
                self.stdout.write(
                    f"         effect {effect['id'][:12]} {effect['tool']} {effect['state']} "
                    f"{effect['target']}"
                )

    def write_question(self, asked: questions.Question) -> None:
        """The question as the dashboard shows it: its heading, each call it asks about in
        full (what a person decides on), then its other words."""
        self.stdout.write(f"         ? {asked.heading}")
        for line in asked.already:
            self.stdout.write(f"         ! {terminal_safe(line)}")
        for call in asked.requests:
            head = f"{call.tool} → {call.target or '(no target)'}"
            head += f": {call.summary}" if call.summary else ""
            self.stdout.write(f"           {terminal_safe(head)}")
            for line in as_text(call.fields, indent="             "):
                self.stdout.write(line)
        for note in asked.notes:
            self.stdout.write(f"         ? {terminal_safe(note)}")


def blocked_questions(task: Task) -> dict[int, questions.Question]:
    """The questions of the task's blocked steps (few: a step blocks its task), by step id."""
    steps = list(task.steps.filter(state=StepState.BLOCKED).select_related("task"))
    effects: dict[int, list[Effect]] = {s.pk: [] for s in steps}
    for effect in Effect.objects.filter(step__in=steps).order_by("created_at", "id"):
        effects[effect.step_id].append(effect)
    found = {s.pk: questions.question(s, effects[s.pk]) for s in steps}
    return {pk: q for pk, q in found.items() if q is not None}
