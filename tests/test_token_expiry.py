"""Agent tokens may expire: `agent_token NAME --user U --expires-in DAYS`; an expired token
gets a 401 that says it expired."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
import time_machine
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from django.utils import timezone

from loop.models import AgentToken


def make_token(*args: str) -> str:
    out = io.StringIO()
    call_command("agent_token", "pippa", *args, user="dad", stdout=out, stderr=io.StringIO())
    return out.getvalue().strip()


def test_a_token_works_until_it_expires_then_says_so(dad: User) -> None:
    with time_machine.travel(timezone.now(), tick=False) as clock:
        token = make_token("--expires-in", "2")
        row = AgentToken.objects.get(name="pippa")
        assert row.expires_at == timezone.now() + timedelta(days=2)
        agent = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
        clock.shift(timedelta(days=2, seconds=-1))
        assert agent.get("/api/tasks").status_code == 200
        clock.shift(timedelta(seconds=1))
        expired = agent.get("/api/tasks")
        assert expired.status_code == 401
        assert expired.json()["error"] == (
            f"Authorization: the token of agent 'pippa' expired at {row.expires_at.isoformat()};"
            " ask for a new one"
        )
        assert 'error="invalid_token"' in expired["WWW-Authenticate"]


def test_a_token_without_expiry_lasts_until_revoked(dad: User) -> None:
    token = make_token()
    assert AgentToken.objects.get(name="pippa").expires_at is None
    with time_machine.travel(timezone.now() + timedelta(days=3650)):
        assert Client(HTTP_AUTHORIZATION=f"Bearer {token}").get("/api/tasks").status_code == 200


@pytest.mark.parametrize("days", ["0", "-1", "soon", "40000"])
def test_a_bad_expiry_is_refused_and_makes_nothing(dad: User, days: str) -> None:
    with pytest.raises(CommandError, match="--expires-in"):
        make_token("--expires-in", days)
    assert not AgentToken.objects.exists()
