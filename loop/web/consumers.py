"""The live page's WebSocket: thin. Join the page's group, replay what the page missed, then
forward the tailer's rendered partials, dropping event ids this connection already sent.

A refusal is sent after accepting, as a close code the page can read (4400 a parameter the page
never sends, such as an id that is not a whole number; 4401 not logged in; 4404 no such topic or
task): a close before the accept reaches the browser as a failed handshake (1006), which it
cannot tell from a network error and would retry forever. While the database or the channel
layer (Redis) is down the socket closes with 4503 (`unavailable.SocketUnavailable` around it):
the page shows "live updates paused" and tries again, backing off."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from .. import numbers, permissions
from ..models import Task
from . import live, zones
from .pages import context

BAD_REQUEST = 4400
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
        can_act = await database_sync_to_async(permissions.may)(user, "answer questions")
        try:
            asked = Asked.read(self.scope.get("query_string", b""))
            topic = live.Topic.parse(asked.topic, can_act=can_act)
            if topic is not None:  # each person's pushes show his own clock
                topic = replace(topic, zone=await database_sync_to_async(zones.of)(user))
        except numbers.NotANumber:
            await self.refuse(BAD_REQUEST)
            return
        if topic is None:
            await self.refuse(NOT_FOUND)
            return
        if topic.task_id is not None and not await database_sync_to_async(task_exists)(
            topic.task_id
        ):
            await self.refuse(NOT_FOUND)
            return
        self.seen = live.SeenIds(await database_sync_to_async(context.trailing_window)())
        self.seen.add(asked.seen)
        self.shown: dict[str, str] = {}  # DOM id -> the HTML this connection last sent for it
        await self.accept()
        self.topic = topic
        # Join first, then replay: an event committed after the replay's read reaches us
        # through the group, one committed before it is in the replay; duplicates are dropped.
        assert self.channel_layer is not None
        await self.channel_layer.group_add(topic.group, self.channel_name)
        await live.tailer().add(topic)
        if asked.after is not None:
            message = await database_sync_to_async(live.replay)(topic, asked.after)
            if message.get("reload"):
                await self.send_json({"reload": True})
                return
            await self.forward(message)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """The page sends nothing: whatever a client sends (text that is not JSON, a binary
        frame) is ignored, never decoded (the JSON consumer's own would end the socket 1011)."""

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


@dataclass(frozen=True)
class Asked:
    """The socket's parameters: `topic` (checked by `live.Topic.parse`), `after` (the last
    event id the page saw; None: no replay) and `seen` (ids the page already has near `after`:
    on PostgreSQL a lower id can commit after a higher one, so the replay re-reads a window
    below `after`, and these are dropped). Ids are whole numbers in ASCII digits
    (`loop.numbers`); NotANumber names the one that is not."""

    topic: str
    after: int | None
    seen: tuple[int, ...]

    @classmethod
    def read(cls, query_string: bytes) -> Asked:
        # Not UTF-8 is no id and no topic: replaced, it fails their checks below by name.
        query = parse_qs(query_string.decode("utf-8", errors="replace"))
        after = query.get("after", [""])[0]
        seen = [i for i in query.get("seen", [""])[0].split(",") if i][: live.SEEN_LIMIT]
        return cls(
            topic=query.get("topic", [""])[0],
            after=numbers.whole(after, "after", low=0, high=live.MAX_ID) if after else None,
            seen=tuple(numbers.whole(i, "seen", low=0, high=live.MAX_ID) for i in seen),
        )


def task_exists(task_id: int) -> bool:
    return Task.objects.filter(pk=task_id).exists()
