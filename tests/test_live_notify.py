"""On PostgreSQL the live feed does not poll: every commit that journals notifies the
journal's channel (a trigger, migration 0011) and each server process's tailer LISTENs for it
(loop/web/live.py `Listener`). Proved with the tailer's fallback look set to a minute: an
event committed by another process still reaches the page at once."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from channels.db import database_sync_to_async
from django.contrib.auth.models import User
from django.db import connection

from loop import journal
from loop.models import Event
from loop.web import live

from .conftest import make_task, manage, step
from .test_live_consumer import connect_as, own_channel_layer, run, seen_near  # noqa: F401

pytestmark = pytest.mark.skipif("connection.vendor != 'postgresql'")


def listening() -> psycopg.Connection[Any]:
    db = connection.settings_dict
    params = {"dbname": db["NAME"], "user": db["USER"], "host": db["HOST"], "port": db["PORT"]}
    conn = psycopg.connect(**{k: str(v) for k, v in params.items() if v}, autocommit=True)
    conn.execute(f"LISTEN {journal.NOTIFY_CHANNEL}")
    return conn


def test_a_commit_that_journals_notifies_once_and_one_that_does_not_is_silent(
    transactional_db: None,
) -> None:
    with listening() as conn:
        make_task(step("a"), step("b"))  # one commit, several events
        got = list(conn.notifies(timeout=2.0))
        assert [n.channel for n in got] == [journal.NOTIFY_CHANNEL]  # folded into one
        User.objects.create(username="no-event")  # commits, journals nothing
        assert list(conn.notifies(timeout=0.5)) == []


def test_an_event_from_another_process_reaches_the_page_without_a_poll(
    transactional_db: None, dad: User, settings: Any
) -> None:
    settings.LOOP_LIVE_PG_POLL_MS = 60_000  # the tailer's fallback look: not within this test
    task = make_task(step("a"), title="watched")
    db = database_sync_to_async

    async def scenario() -> None:
        start = await db(lambda: Event.objects.latest("id").pk)()
        rendered = await db(seen_near)(start)  # what a page rendered at `start` reflects
        page = await connect_as(dad, f"topic=task-{task.pk}&after={start}&seen={rendered}")
        try:
            await watch(page, start)
        finally:
            await page.disconnect()
            await live.tailer().stop()

    async def watch(page: Any, start: int) -> None:
        opening = await page.receive_json_from(timeout=5)
        assert opening["events"] == []
        # another process: its commit wakes no in-process listener, only the NOTIFY
        code = (
            "from loop import actions; from loop.permissions import SYSTEM; "
            f"actions.pause(task_id={task.pk}, actor='dad', user=SYSTEM)"
        )
        await db(manage)("shell", "-c", code)
        paused = await db(
            lambda: set(Event.objects.filter(id__gt=start, task=task).values_list("id", flat=True))
        )()
        assert paused
        pushed = await page.receive_json_from(timeout=5)
        assert set(pushed["events"]) == paused
        assert any('data-state="paused"' in s["html"] for s in pushed["swaps"])
        assert live.tailer().listener is not None

    run(scenario)
