from __future__ import annotations

import getpass
from typing import Any

from django.core.management.base import CommandError, CommandParser

from loop import actions
from loop.management.base import LoopCommand, whole_number
from loop.models import Step
from loop.permissions import SYSTEM


class Command(LoopCommand):
    help = "Run a failed step again: a replacement with a fresh attempt cap, under its key."
    act = staticmethod(actions.retry_step)

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("step", type=whole_number("step"))

    def handle(self, *args: Any, **options: Any) -> None:
        if not Step.objects.filter(pk=options["step"]).exists():
            raise CommandError(f"step: no step {options['step']}")
        try:
            step = self.act(step_id=options["step"], actor=f"cli:{getpass.getuser()}", user=SYSTEM)
        except actions.Refused as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"step {step.pk} '{step.key}' is now {step.state}")
