from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import CommandError, CommandParser

from loop.api.core import issue
from loop.management.base import LoopCommand
from loop.models import AgentToken


class Command(LoopCommand):
    help = "Make an API token for an agent (printed once), or revoke one."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="the agent's name (its actor is agent:NAME)")
        action = parser.add_mutually_exclusive_group(required=True)
        action.add_argument("--user", help="the user whose permissions the agent acts with")
        action.add_argument("--revoke", action="store_true", help="revoke NAME's live token")

    def handle(self, *args: Any, **options: Any) -> None:
        name = options["name"]
        if options["revoke"]:
            if not AgentToken.objects.filter(name=name, revoked=False).update(revoked=True):
                raise CommandError(f"name: no live token named '{name}'")
            self.stdout.write(f"revoked the token of agent '{name}'")
            return
        user = get_user_model().objects.filter(username=options["user"]).first()
        if user is None:
            raise CommandError(f"--user: no user '{options['user']}'")
        if AgentToken.objects.filter(name=name, revoked=False).exists():
            raise CommandError(f"name: agent '{name}' already has a live token (--revoke it first)")
        _, token = issue(name=name, user=user)
        self.stdout.write(token)
