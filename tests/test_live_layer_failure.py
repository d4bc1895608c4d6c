"""A channel layer that refuses a send (Redis restarting) costs an open page nothing: the
tailer keeps the message and sends it again, instead of its task dying and every page of the
process going quiet until a new one connects."""

from __future__ import annotations

from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.contrib.auth.models import User

from loop import actions
from loop.models import Event
from loop.permissions import SYSTEM
from loop.web import live

from .conftest import make_task, step
from .test_live_consumer import (
    connect_as,
    ids,
    messages_until,
    new_ids,
    own_channel_layer,
    run,
    seen_near,
)

__all__ = ["own_channel_layer"]  # the fixture, for this module's tests too


def test_a_refused_send_reaches_the_open_page_once_the_layer_takes_it_again(
    transactional_db: None, dad: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    task = make_task(step("a"), title="watched")
    db = database_sync_to_async

    async def scenario() -> None:
        layer = get_channel_layer()
        assert layer is not None
        send = layer.group_send
        refusals = []

        async def flaky(group: str, message: dict[str, Any]) -> None:
            if len(refusals) < 2:
                refusals.append(group)
                raise ConnectionError("Connection closed by server.")
            await send(group, message)

        start = await db(lambda: Event.objects.latest("id").pk)()
        rendered = await db(seen_near)(start)  # what a page rendered at `start` reflects
        page = await connect_as(dad, f"topic=task-{task.pk}&after={start}&seen={rendered}")
        assert (await page.receive_json_from(timeout=5))["events"] == []  # nothing missed
        monkeypatch.setattr(layer, "group_send", flaky)

        await db(actions.pause)(task_id=task.pk, actor="dad", user=SYSTEM)
        paused = await db(new_ids)(start, task.pk)
        got = await messages_until(page, paused)
        assert len(refusals) == 2
        assert sorted(ids(got)) == sorted(paused)

        await db(actions.resume)(task_id=task.pk, actor="dad", user=SYSTEM)
        resumed = await db(new_ids)(max(paused), task.pk)
        later = await messages_until(page, resumed)  # the tailer lives on
        assert sorted(ids(later)) == sorted(resumed)
        await page.disconnect()
        await live.tailer().stop()

    run(scenario)
