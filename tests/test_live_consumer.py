"""The live WebSocket: who may connect, and a reconnect that catches up exactly."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.layers import DEFAULT_CHANNEL_LAYER, channel_layers, get_channel_layer
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User

from loop import actions
from loop.models import Event
from loop.permissions import SYSTEM
from loop.web import live
from loop.web.consumers import LiveConsumer
from pippa_site.asgi import application

from .conftest import make_task, step

ORIGIN = [(b"origin", b"http://127.0.0.1:8000"), (b"host", b"127.0.0.1:8000")]


@pytest.fixture(autouse=True)
def own_channel_layer() -> Iterator[None]:
    """Each test gets a channel layer of its own, so no state of an earlier test's event loop
    (a Redis layer keeps per-loop pools and receive clean-ups) is waited on in this one."""
    channel_layers.backends.pop(DEFAULT_CHANNEL_LAYER, None)
    yield
    channel_layers.backends.pop(DEFAULT_CHANNEL_LAYER, None)


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    """The scenario on an event loop of its own. If it hangs, it fails within a minute. The
    failure's traceback shows the await it was stuck in."""

    async def bounded() -> None:
        await asyncio.wait_for(scenario(), timeout=60)

    async_to_sync(bounded)()


async def connect_as(user: User, query: str) -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(LiveConsumer.as_asgi(), f"/ws/live?{query}", ORIGIN)
    communicator.scope["user"] = user
    connected, _ = await communicator.connect()
    assert connected
    return communicator


async def messages_until(
    communicator: WebsocketCommunicator, want: set[int]
) -> list[dict[str, Any]]:
    """Receive until every id in `want` arrived; then make sure nothing more comes."""
    got: list[dict[str, Any]] = []
    seen: set[int] = set()
    while not want <= seen:
        message = await communicator.receive_json_from(timeout=5)
        got.append(message)
        seen.update(message["events"])
    assert await communicator.receive_nothing(timeout=0.3)
    return got


def seen_near(last: int) -> str:
    from loop.web.pages.context import seen_near as page_seen

    return page_seen(last)


def ids(messages: list[dict[str, Any]]) -> list[int]:
    return [i for m in messages for i in m["events"]]


def new_ids(after: int, task_id: int) -> set[int]:
    return set(Event.objects.filter(id__gt=after, task_id=task_id).values_list("id", flat=True))


async def refused_with(communicator: WebsocketCommunicator) -> int:
    """The close code of a refusal. The handshake is accepted first, so a browser sees the
    code; a close before the accept reaches it as a failed handshake (1006) instead."""
    connected, _ = await communicator.connect()
    assert connected, "a refusal must follow an accepted handshake"
    closing = await communicator.receive_output(timeout=5)
    assert closing["type"] == "websocket.close", closing
    return int(closing["code"])


def test_anonymous_is_refused_with_4401_after_the_handshake(transactional_db: None) -> None:
    async def scenario() -> None:
        communicator = WebsocketCommunicator(application, "/ws/live?topic=home&after=0", ORIGIN)
        assert await refused_with(communicator) == 4401

    run(scenario)


def test_a_topic_for_a_task_that_does_not_exist_is_refused_with_4404(
    transactional_db: None, guest: User
) -> None:
    task = make_task(step("a"))
    missing = task.pk + 1000

    async def scenario() -> None:
        for query in (f"topic=task-{missing}&after=0", "topic=nonsense"):
            communicator = WebsocketCommunicator(LiveConsumer.as_asgi(), f"/ws/live?{query}")
            communicator.scope["user"] = guest
            assert await refused_with(communicator) == 4404, query
        # The task that does exist is followed.
        followed = await connect_as(guest, f"topic=task-{task.pk}&after=0")
        assert (await followed.receive_json_from(timeout=5))["swaps"]
        await followed.disconnect()
        await live.tailer().stop()

    run(scenario)


def test_reconnect_with_the_last_event_id_gets_exactly_the_missed_events(
    transactional_db: None, dad: User
) -> None:
    task = make_task(step("a"), step("b"), title="watched")
    other = make_task(step("x"), title="not watched")
    topic = f"topic=task-{task.pk}"
    db = database_sync_to_async

    async def scenario() -> None:
        await get_channel_layer().flush()
        start = await db(lambda: Event.objects.latest("id").pk)()
        rendered = await db(seen_near)(start)  # what a page rendered at `start` reflects
        first = await connect_as(dad, f"{topic}&after={start}&seen={rendered}")
        opening = await first.receive_json_from(timeout=5)
        assert opening["events"] == [] and {s["id"] for s in opening["swaps"]} >= {
            "task-head",
            "steps",
        }

        await db(actions.pause)(task_id=task.pk, actor="dad", user=SYSTEM)
        live_ones = await db(new_ids)(start, task.pk)
        got = await messages_until(first, live_ones)
        assert sorted(ids(got)) == sorted(live_ones)
        assert any('data-state="paused"' in s["html"] for m in got for s in m["swaps"])
        last_seen = max(ids(got))
        await first.disconnect()

        # While the page is away: changes to this task and to another one.
        await db(actions.resume)(task_id=task.pk, actor="dad", user=SYSTEM)
        await db(actions.add_steps)(task_id=task.pk, steps=[step("c")], actor="pippa", user=SYSTEM)
        await db(actions.pause)(task_id=other.pk, actor="dad", user=SYSTEM)
        missed = await db(new_ids)(last_seen, task.pk)
        assert missed

        # What the page has, as live.js keeps it (it matters on PostgreSQL).
        seen = ",".join(filter(None, [rendered, *(str(i) for i in ids(got))]))
        second = await connect_as(dad, f"{topic}&after={last_seen}&seen={seen}")
        replayed = await second.receive_json_from(timeout=5)
        assert replayed["events"] == sorted(missed)
        assert [r["id"] for r in replayed["rows"]] == [f"event-{i}" for i in sorted(missed)]

        await db(actions.pause)(task_id=task.pk, actor="dad", user=SYSTEM)
        newest = await db(new_ids)(max(missed), task.pk)
        later = await messages_until(second, newest)
        assert sorted(ids(later)) == sorted(newest)  # nothing replayed twice, nothing lost
        await second.disconnect()
        await live.tailer().stop()

    run(scenario)


def test_a_reader_gets_pages_without_buttons(
    transactional_db: None, guest: User, dad: User
) -> None:
    make_task(step("pay", "http.post", args={"url": "http://127.0.0.1:9/p"}, confirm_before=True))
    from loop.worker import Worker

    runner = Worker(label="t")
    runner.boot()
    runner.tick()

    async def scenario() -> None:
        await get_channel_layer().flush()
        reader = await connect_as(guest, "topic=home&after=0")
        message = await reader.receive_json_from(timeout=5)
        needs_you = next(s["html"] for s in message["swaps"] if s["id"] == "needs-you")
        assert "May I do this?" in needs_you and "Allow once" not in needs_you
        assert message["count"] == 1
        await reader.disconnect()
        boss = await connect_as(dad, "topic=home&after=0")
        message = await boss.receive_json_from(timeout=5)
        needs_you = next(s["html"] for s in message["swaps"] if s["id"] == "needs-you")
        assert "Allow once" in needs_you
        await boss.disconnect()
        await live.tailer().stop()

    run(scenario)
