from __future__ import annotations

import getpass
import json
from typing import Any

from django.core.management.base import CommandError, CommandParser

from loop import actions, plans, questions
from loop.management.base import LoopCommand, whole_number
from loop.models import Effect, Step
from loop.permissions import SYSTEM
from loop.tools.shown import terminal_safe


class Command(LoopCommand):
    help = "Answer a blocked step's question."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("step", type=whole_number("step"))
        group = parser.add_mutually_exclusive_group(required=True)
        for decision, text in [
            ("allow", "May I do this? - allow once"),
            ("deny", "May I do this? - deny, with --note REASON (a model step goes on)"),
            ("happened", "Did this happen? - it happened"),
            ("rerun", "Did this happen? - it did not, do it"),
            ("fail", "Did this happen? - fail the step"),
        ]:
            group.add_argument(
                f"--{decision}", dest="decision", action="store_const", const=decision, help=text
            )
        group.add_argument(
            "--reply", metavar="TEXT", help="words to Pippa about the question, no decision"
        )
        parser.add_argument(
            "--note", default="", help="what you know (kept as the receipt); with --deny: why"
        )
        parser.add_argument(
            "--args",
            dest="call_args",
            metavar="JSON",
            help="with --allow: edit, then allow - the call's arguments as you changed them",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        asking = Step.objects.select_related("task").filter(pk=options["step"]).first()
        if asking is None:
            raise CommandError(f"step: no step {options['step']}")
        asked = questions.question(asking, asking.effects.order_by("created_at", "id"))
        decision, note = options["decision"], options["note"]
        if options["reply"] is not None:
            decision, note = actions.REPLY, options["reply"]
        edited = None
        if options["call_args"] is not None:
            try:
                edited = json.loads(options["call_args"])
            except ValueError as exc:
                raise CommandError(f"args: not JSON: {exc}") from None
        try:
            step = actions.unblock(
                step_id=options["step"],
                decision=decision,
                actor=f"cli:{getpass.getuser()}",
                user=SYSTEM,  # the operator at the shell
                note=note,
                args=edited,
            )
        except (actions.Refused, plans.PlanError) as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"step {step.pk} '{step.key}' is now {step.state}")
        # What the answer settled: the effects the question named, as they are now.
        for effect in Effect.objects.filter(pk__in=[e.pk for e in asked.effects] if asked else []):
            line = f"  effect {effect.pk[:12]} {effect.tool} → {effect.target}: {effect.state}"
            self.stdout.write(terminal_safe(line))
