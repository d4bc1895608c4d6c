from __future__ import annotations

import getpass
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import CommandError, CommandParser

from loop import conversation, turns
from loop.management.base import LoopCommand
from loop.permissions import SYSTEM


class Command(LoopCommand):
    help = "Write a message in the conversation (it ends any schedule's standing authorization)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("text")
        parser.add_argument(
            "--as", dest="user", help="a user of the site, the author (default: your login)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if (
            options["user"]
            and not get_user_model().objects.filter(username=options["user"]).exists()
        ):
            raise CommandError(f"--as: no user '{options['user']}'")
        author = options["user"] or getpass.getuser()
        try:
            message, _turn = turns.post(author=author, text=options["text"], user=SYSTEM)
        except conversation.MessageError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(str(message.pk))
