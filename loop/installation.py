"""The installation's secret (DESIGN.md §6, invariant 15): random, made once per database, and
part of every effect id, so two databases — a reset, a second install sharing a receiver —
never send the same `Idempotency-Key` for different effects.

Made by migration 0012 and, after a test database is flushed, by `post_migrate` (the flush
emits it); read once per process and database, then kept.
"""

from __future__ import annotations

import secrets
from typing import Any

from django.db import connection

from .models import Installation

_known: dict[str, str] = {}  # the database's NAME -> its installation's secret


def secret() -> str:
    """This database's installation secret (one query the first time in a process)."""
    name = str(connection.settings_dict["NAME"])
    found = _known.get(name)
    if found is None:
        found = _known[name] = _made().secret
    return found


def _made() -> Installation:
    row = Installation.objects.order_by("id").first()
    if row is None:
        row, _ = Installation.objects.get_or_create(pk=1, defaults={"secret": _new()})
    return row


def _new() -> str:
    return secrets.token_hex(32)


def after_migrate(**kwargs: Any) -> None:
    """`post_migrate`: the row exists (a flush emptied it), and no stale secret is kept."""
    _known.clear()
    if kwargs.get("using", "default") == "default":
        _made()
