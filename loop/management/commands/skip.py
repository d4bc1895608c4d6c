from __future__ import annotations

from loop import actions

from .retry import Command as Retry


class Command(Retry):
    help = "Skip a failed step: its task runs on without its output."
    act = staticmethod(actions.skip_step)
