"""The conversation page's live feed (topic "conversation"): a message or a schedule's run,
committed anywhere, is pushed as the page's partials; a reconnect replays what was missed."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from channels.db import database_sync_to_async
from channels.layers import DEFAULT_CHANNEL_LAYER, channel_layers, get_channel_layer
from django.contrib.auth.models import User
from django.utils import timezone

from loop import conversation, plans, schedules
from loop.models import AuthorKind, Event, Schedule
from loop.permissions import SYSTEM
from loop.web import live

from .conftest import make_task, step
from .test_live_consumer import connect_as, run


@pytest.fixture(autouse=True)
def own_channel_layer() -> Iterator[None]:
    channel_layers.backends.pop(DEFAULT_CHANNEL_LAYER, None)
    yield
    channel_layers.backends.pop(DEFAULT_CHANNEL_LAYER, None)


def swaps(message: dict[str, object]) -> dict[str, str]:
    return {s["id"]: s["html"] for s in message["swaps"]}  # type: ignore[attr-defined]


def test_messages_and_runs_arrive_live_and_task_events_do_not(
    transactional_db: None, dad: User
) -> None:
    plan = {"title": "numbers", "schedule": "0 8 * * MON", "steps": [step("a")]}
    schedule = schedules.create(spec=plans.validate(plan), actor="dad", user=SYSTEM)
    start = Event.objects.order_by("-id").values_list("id", flat=True).first()

    def say(text: str) -> int:
        return conversation.post(author="pippa", kind=AuthorKind.AGENT, text=text, user=SYSTEM).pk

    def fire() -> None:
        Schedule.objects.filter(pk=schedule.pk).update(
            next_due=timezone.now() - timedelta(seconds=1)
        )
        schedules.fire_due(actor="test")

    async def scenario() -> None:
        await get_channel_layer().flush()
        page = await connect_as(dad, f"topic=conversation&after={start}")
        first = await page.receive_json_from(timeout=5)  # the replay: the page as it is now
        assert "Nobody has written yet." in swaps(first)["messages"]
        await database_sync_to_async(make_task)(step("x"))  # not the conversation's business
        message_id = await database_sync_to_async(say)("the numbers are in")
        pushed = await page.receive_json_from(timeout=5)
        assert f'id="message-{message_id}"' in swaps(pushed)["messages"]
        await database_sync_to_async(fire)()
        pushed = await page.receive_json_from(timeout=5)
        assert "[SCHEDULED TASK] numbers" in swaps(pushed)["messages"]
        assert "task " in swaps(pushed)["schedules"]  # its last run links its task
        kinds = await database_sync_to_async(
            lambda: set(
                Event.objects.filter(pk__in=pushed["events"]).values_list("kind", flat=True)
            )
        )()
        assert kinds <= live.CONVERSATION_KINDS
        await page.disconnect()
        await live.tailer().stop()

    run(scenario)
