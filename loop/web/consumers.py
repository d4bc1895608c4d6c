"""The live page's WebSocket: thin. Join the page's group, replay what the page missed, then
forward the tailer's rendered partials, dropping event ids this connection already sent.

A refusal is sent after accepting, as a close code the page can read (4401 not logged in, 4404
no such topic or task): a close before the accept reaches the browser as a failed handshake
(1006), which it cannot tell from a network error and would retry forever. While the database
or the channel layer (Redis) is down the socket closes with 4503 (`unavailable.SocketUnavailable`
around it): the page shows "live updates paused" and tries again, backing off."""

from __future__ import annotations

import contextlib
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from .. import permissions
from ..models import Task
from . import live
from .pages import context

UNAUTHENTICATED = 4401
FORBIDDEN = 4403  # reserved for topics a logged-in user may not read (none yet); live.js knows it
NOT_FOUND = 4404


class LiveConsumer(AsyncJsonWebsocketConsumer):
    """`ws/live?topic=home|task-<id>&after=<last event id the page saw>`"""

    topic: live.Topic | None = None

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.refuse(UNAUTHENTICATED)
            return
        query = parse_qs(self.scope.get("query_string", b"").decode())
        can_act = await database_sync_to_async(permissions.may)(user, "answer questions")
        topic = live.Topic.parse(query.get("topic", [""])[0], can_act=can_act)
        after_raw = query.get("after", [""])[0]
        # `seen`: ids the page already has near `after`. On PostgreSQL a lower id can commit
        # after a higher one, so the replay re-reads a window below `after`; these are dropped.
        seen_raw = [i for i in query.get("seen", [""])[0].split(",") if i][: live.SEEN_LIMIT]
        if topic is None or not all(i.isdigit() for i in [after_raw or "0", *seen_raw]):
            await self.refuse(NOT_FOUND)
            return
        if topic.task_id is not None and not await database_sync_to_async(task_exists)(
            topic.task_id
        ):
            await self.refuse(NOT_FOUND)
            return
        self.seen = live.SeenIds(await database_sync_to_async(context.trailing_window)())
        self.seen.add(int(i) for i in seen_raw)
        self.shown: dict[str, str] = {}  # DOM id -> the HTML this connection last sent for it
        await self.accept()
        self.topic = topic
        # Join first, then replay: an event committed after the replay's read reaches us
        # through the group, one committed before it is in the replay; duplicates are dropped.
        assert self.channel_layer is not None
        await self.channel_layer.group_add(topic.group, self.channel_name)
        await live.tailer().add(topic)
        if after_raw:
            message = await database_sync_to_async(live.replay)(topic, int(after_raw))
            if message.get("reload"):
                await self.send_json({"reload": True})
                return
            await self.forward(message)

    async def refuse(self, code: int) -> None:
        await self.accept()
        await self.close(code=code)

    async def disconnect(self, code: int) -> None:
        if self.topic is None:
            return
        live.tailer().remove(self.topic)
        assert self.channel_layer is not None
        # The layer down (Redis): its group membership expires there by itself.
        with contextlib.suppress(Exception):
            await self.channel_layer.group_discard(self.topic.group, self.channel_name)

    async def live_push(self, event: dict[str, Any]) -> None:
        await self.forward(event["message"])

    async def forward(self, message: dict[str, Any]) -> None:
        fresh = [i for i in message["events"] if i not in self.seen]
        rows = [r for r in message.get("rows", []) if r["event"] in fresh]
        swaps = [s for s in message.get("swaps", []) if self.shown.get(s["id"]) != s["html"]]
        if not fresh and not swaps:
            return
        self.seen.add(fresh)
        for swap in swaps:
            self.shown[swap["id"]] = swap["html"]
        out = {"events": fresh, "swaps": swaps, "rows": rows}
        if "count" in message:
            out["count"] = message["count"]
        await self.send_json(out)


def task_exists(task_id: int) -> bool:
    return Task.objects.filter(pk=task_id).exists()
