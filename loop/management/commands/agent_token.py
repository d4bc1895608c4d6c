from __future__ import annotations

from argparse import ArgumentTypeError
from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import CommandError, CommandParser
from django.utils import timezone

from loop import numbers
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
        parser.add_argument(
            "--answers",
            action="store_true",
            help="a person's own client: the token may answer questions and approve plans as "
            "its user (an agent token never does)",
        )
        parser.add_argument(
            "--expires-in",
            type=days,
            metavar="DAYS",
            help="the token stops working after this many days (default: only when revoked)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        name = options["name"]
        if options["revoke"] and options["expires_in"] is not None:
            raise CommandError("--expires-in: only for a new token (with --user)")
        if options["revoke"] and options["answers"]:
            raise CommandError("--answers: only for a new token (with --user)")
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
        expires_in = options["expires_in"]
        expires_at = timezone.now() + expires_in if expires_in is not None else None
        _, token = issue(name=name, user=user, expires_at=expires_at, answers=options["answers"])
        self.stdout.write(token)
        if expires_at is not None:
            self.stderr.write(f"it expires at {expires_at.isoformat()}")


def days(raw: str) -> timedelta:
    try:
        value = numbers.number(raw, "--expires-in")  # ASCII digits: no '١٢', nan or 1e3
    except numbers.NotANumber:
        raise ArgumentTypeError(f"must be a number of days, not {raw!r}") from None
    if not 0 < value <= 36500:
        raise ArgumentTypeError(f"must be more than 0 days (and at most 36500), not {raw}")
    return timedelta(days=value)
