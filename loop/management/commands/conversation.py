from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandParser

from loop import conversation
from loop.management.base import LoopCommand
from loop.tools.shown import terminal_safe


class Command(LoopCommand):
    help = "Show the conversation, oldest first."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        messages = [conversation.message_dict(m) for m in conversation.history()]
        if options["json"]:
            shown = [{k: m[k] for k in ("id", "author", "text", "at")} for m in messages]
            self.stdout.write(json.dumps(shown, indent=2))
            return
        for m in messages:
            self.stdout.write(f"{m['id']:>6} {m['at'][:19]} {terminal_safe(m['author'])}:")
            for line in m["text"].splitlines() or [""]:
                self.stdout.write(f"         {terminal_safe(line)}")
