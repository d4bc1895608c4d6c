"""A testing knob: cap the SQLite database's size from outside a running process.

`PRAGMA max_page_count` is per connection, so a test cannot set it for a child `runloop`.
With `PIPPA_EXTRA_APPS=tests.support.pagelimit` and `PIPPA_TEST_PAGE_LIMIT_FILE=/some/file`, every
connection of that process applies the number in the file (when it changes) before its next
statement; a missing or empty file means no cap. The test writes the database's current page
count to cause a real SQLITE_FULL ("database or disk is full"), and a large number to make
room again. Never installed outside tests.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.apps import AppConfig
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.signals import connection_created


def _wanted() -> int | None:
    path = os.environ.get("PIPPA_TEST_PAGE_LIMIT_FILE", "")
    try:
        text = Path(path).read_text().strip() if path else ""
    except FileNotFoundError:
        return None
    return int(text) if text else None


def _install(sender: Any, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
    """On every new connection: forget what was applied (a new sqlite3 connection has no
    cap), and make sure the wrapper that applies the file's number is in place."""
    if connection.vendor != "sqlite":
        return
    state: dict[str, Any] = connection.__dict__.setdefault("_page_limit", {})
    state["applied"] = "nothing yet"
    if state.get("installed"):
        return

    def wrapper(
        execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any
    ) -> Any:
        wanted = _wanted()
        if connection.connection is not None and state["applied"] != wanted:
            connection.connection.execute(f"PRAGMA max_page_count = {wanted or 1073741823}")
            state["applied"] = wanted
        return execute(sql, params, many, context)

    connection.execute_wrappers.append(wrapper)
    state["installed"] = True


class PageLimitConfig(AppConfig):
    name = "tests.support.pagelimit"
    label = "pagelimit"

    def ready(self) -> None:
        connection_created.connect(_install)
