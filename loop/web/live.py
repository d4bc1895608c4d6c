"""Live pages (DESIGN.md "Live pages"): the journal is the feed.

Each server process runs one `Tailer`, an asyncio task started by the first consumer that
connects. It reads the events after the last id it broadcast (a short poll: the worker is
another process; commits in this process also wake it through `journal.on_event`; on
PostgreSQL the journal's NOTIFY wakes it instead, `Listener`, and it polls only in case a
notice was lost), renders
the partials those events touch, and sends them to this process's groups on the channel
layer, one group per topic and permission ("home.act", "task-7.read"). Group names carry a
process token, so with Redis every process's tailer serves only its own consumers and nothing
depends on two processes sharing memory.

A message is `{"events": [ids], "swaps": [{"id", "html"}], "rows": [{"id", "into", "html",
"event"}], "count": n}`: `swaps` replace the element with that DOM id, `rows` are journal rows
added once, `count` is how many questions wait. The same `render()` serves the tailer and a
reconnecting page's replay, and every piece of HTML comes from a template partial.

Event ids: on SQLite (one writer at a time) ids commit in order, so "after the last id" loses
nothing. On PostgreSQL a lower id can commit after a higher one; there the tailer re-reads a
trailing window of ids and skips those it already sent (`SeenIds`); a reconnecting page sends
the ids it has seen within that window, so its replay is exact there too.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from zoneinfo import ZoneInfo

from django.conf import settings
from django.db import DatabaseError, connection
from django.db.models import Max
from django.template.loader import render_to_string
from django.utils import timezone

from .. import journal, numbers, open_steps, sql
from ..models import Event, EventKind, Task
from . import timeline
from .pages import context, talk

log = logging.getLogger("loop.web.live")

POLL_SECONDS = settings.LOOP_LIVE_POLL_MS / 1000
BANNER_SECONDS = 5.0
BATCH = 500
UNSENT = 1000  # messages a tailer keeps while the channel layer refuses them
REPLAY_ROWS = 200
SEEN_LIMIT = 1024  # at most this many ids in a reconnecting page's `seen`
MAX_ID = 2**63 - 1  # the largest id a database row can have (a 64-bit integer column)
PROCESS = f"p{os.getpid()}-{secrets.token_hex(4)}"
PLAN_CHANGES = frozenset({EventKind.STEPS_ADDED, EventKind.STEP_EDITED})
WORKER_KINDS = frozenset(
    {
        EventKind.WORKER_STARTED,
        EventKind.WORKER_DEAD,
        EventKind.WORKER_STOPPED,
        EventKind.WORKER_PARKED,
        EventKind.WRITE_FAILED,
    }
)


CONVERSATION_KINDS = frozenset(
    {
        EventKind.MESSAGE_POSTED,
        EventKind.SCHEDULE_CREATED,
        EventKind.SCHEDULE_EDITED,
        EventKind.SCHEDULE_FIRED,
        EventKind.SCHEDULE_FAILED,
        EventKind.PLAN_APPROVED,  # a proposal's card in the conversation
        EventKind.PLAN_DECLINED,
    }
)


class SeenIds:
    """Event ids already handled. Below `top - window` everything counts as seen."""

    def __init__(self, window: int, top: int = 0) -> None:
        self.window = window
        self.top = top
        self.recent: set[int] = set()

    def __contains__(self, event_id: int) -> bool:
        return event_id <= self.top - self.window or event_id in self.recent

    def add(self, ids: Iterable[int]) -> None:
        for event_id in ids:
            self.recent.add(event_id)
            self.top = max(self.top, event_id)
        if self.window == 0:
            self.recent.clear()
        elif len(self.recent) > 4 * self.window:
            floor = self.top - self.window
            self.recent = {i for i in self.recent if i > floor}


@dataclass(frozen=True)
class Topic:
    """What a page follows: "home" or "task-<id>", seen by someone who may act or not."""

    page: str
    can_act: bool
    zone: str = ""  # the viewer's own time zone ("" for the site's): times render in it

    @classmethod
    def parse(cls, page: str, *, can_act: bool) -> Topic | None:
        if page in ("home", "conversation"):
            return cls(page, can_act)
        """The topic named `page`; None if there is none such; NotANumber for a task's whose
        id is not a whole number in ASCII digits (`loop.numbers`)."""
        if page.startswith("task-"):
            task_id = numbers.whole(page[5:], "topic", low=1, high=MAX_ID)
            return cls(f"task-{task_id}", can_act)
        return None

    @property
    def task_id(self) -> int | None:
        return int(self.page[5:]) if self.page.startswith("task-") else None

    @property
    def group(self) -> str:
        zone = "".join(c if c.isalnum() or c in "-_" else "." for c in self.zone)
        return f"live.{PROCESS}.{self.page}.{'act' if self.can_act else 'read'}.{zone}"

    def wants(self, event: Event) -> bool:
        if self.page == "conversation":
            return event.kind in CONVERSATION_KINDS
        return self.task_id is None or event.task_id == self.task_id


# ---- rendering (sync: call from a thread) ------------------------------------------------


def _swap(dom_id: str, template: str, ctx: dict[str, Any]) -> dict[str, str]:
    return {"id": dom_id, "html": render_to_string(template, ctx).strip()}


def banner_swap() -> dict[str, str]:
    return _swap("banner", "loop/home.html#banner", {"problems": context.health.banner()})


def render(topic: Topic, events: list[Event], *, full: bool = False) -> dict[str, Any]:
    """The message for `events` (already filtered for `topic`). `full` renders every part of
    the page (a replay); otherwise only the parts these events can have touched. Times in the
    topic's zone."""
    with timezone.override(ZoneInfo(topic.zone) if topic.zone else None):
        return _render(topic, events, full=full)


def _render(topic: Topic, events: list[Event], *, full: bool = False) -> dict[str, Any]:
    message: dict[str, Any] = {"events": [e.pk for e in events], "swaps": [], "rows": []}
    if topic.page == "conversation":
        page = {**talk.page_context(), "can_act": topic.can_act}
        for part in ("messages", "schedules"):
            message["swaps"].append(_swap(part, f"loop/conversation.html#{part}", page))
        message["count"] = context.waiting_count()
        return message
    if topic.task_id is None:
        with sql.snapshot():  # a row's counters and its section from one moment
            page = context.home(can_act=topic.can_act, with_banner=False)
            for part in ("needs-you", "running", "recent"):
                message["swaps"].append(_swap(part, f"loop/home.html#{part}", page))
        if full or any(e.kind in WORKER_KINDS for e in events):
            message["swaps"].append(banner_swap())
        message["count"] = page["waiting"]
        return message
    with sql.snapshot():  # the counters, the steps and the timeline from one moment
        return _render_task(topic, events, message, full=full)


def _render_task(
    topic: Topic, events: list[Event], message: dict[str, Any], *, full: bool
) -> dict[str, Any]:
    assert topic.task_id is not None
    task = Task.objects.filter(pk=topic.task_id).first()
    message["count"] = context.waiting_count()
    if task is None:
        return message
    base = {"task": task, "can_act": topic.can_act}
    head = context.task_head(task, can_act=topic.can_act)
    message["swaps"].append(_swap("task-head", "loop/task.html#task-head", head))
    kinds = {e.kind for e in events}
    window = (
        context.step_window(task) if full or kinds & (PLAN_CHANGES | timeline.LIFECYCLE) else None
    )
    if window is not None and (full or kinds & PLAN_CHANGES):
        steps = context.step_views(task, window=window)
        ctx = {**base, "steps": steps, "window": window}
        message["swaps"].append(_swap("steps", "loop/task.html#steps", ctx))
    else:
        touched = {e.step_id for e in events if e.step_id} | _moved_since(task, events)
        current = open_steps.first_open([task.pk]).get(task.pk)
        if touched and current:
            touched.add(current.pk)
        for view in context.step_views(task, only=touched) if touched else []:
            ctx = {**base, "view": view}
            message["swaps"].append(_swap(f"step-{view.step.pk}", "loop/task.html#step-card", ctx))
    if window is not None and (full or kinds & timeline.LIFECYCLE):
        ctx = {**base, "timeline": context.task_timeline(task, window)}
        message["swaps"].append(_swap("timeline", "loop/task.html#timeline", ctx))
    shown = events[-REPLAY_ROWS:]
    for row in context.journal_rows(shown):
        html = render_to_string("loop/task.html#journal-row", {"row": row}).strip()
        message["rows"].append(
            {
                "id": f"event-{row.event.pk}",
                "into": "journal-rows",
                "html": html,
                "event": row.event.pk,
            }
        )
    return message


def _moved_since(task: Task, events: list[Event]) -> set[int]:
    """The task's steps whose events committed after `events` were read but before this
    render's snapshot: their rows are rendered too, or the counters (which count them) and
    the rows shown would disagree until the next push."""
    if not events:
        return set()
    floor = max(e.pk for e in events) - context.trailing_window()
    later = Event.objects.filter(task_id=task.pk, id__gt=floor, step_id__isnull=False)
    return set(later.values_list("step_id", flat=True))


def replay(topic: Topic, after: int) -> dict[str, Any]:
    """Everything a page that saw events up to `after` missed, with the page's parts as they
    are now. On PostgreSQL a trailing window is re-read; the consumer drops ids it sent.

    If event `after` is gone (pruned, `loop.prune`), what the page shows may be gone too:
    `{"reload": true}`, and the page loads afresh rather than patching what no longer is."""
    if after > 0 and not Event.objects.filter(pk=after).exists():
        return {"reload": True, "events": [], "swaps": [], "rows": []}
    events = Event.objects.filter(id__gt=after - context.trailing_window()).order_by("id")
    if topic.task_id is not None:
        events = events.filter(task_id=topic.task_id)
    elif topic.page == "conversation":
        events = events.filter(kind__in=CONVERSATION_KINDS)
    return render(topic, list(events), full=True)


# ---- the tailer ----------------------------------------------------------------------------


class Tailer:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.topics: dict[Topic, int] = {}
        self.wake = asyncio.Event()
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="live-tailer")
        self.seen: SeenIds | None = None
        self.task: asyncio.Task[None] | None = None
        self.banner = ""
        self.banner_at = 0.0
        self.listener: Listener | None = None
        self.outage = Outage("live tailer")

    async def add(self, topic: Topic) -> None:
        """Follow `topic`. The first call starts the tailer at the newest event id, before
        the caller replays from its own id, so nothing falls between the two."""
        self.topics[topic] = self.topics.get(topic, 0) + 1
        if self.task is None or self.task.done():
            self.seen = await self.loop.run_in_executor(self.executor, self._start_at)
            if connection.vendor == "postgresql" and self.listener is None:
                self.listener = Listener(self.poke)
            self.task = self.loop.create_task(self.run())

    def remove(self, topic: Topic) -> None:
        left = self.topics.get(topic, 0) - 1
        if left > 0:
            self.topics[topic] = left
        else:
            self.topics.pop(topic, None)

    async def stop(self) -> None:
        """Cancel the polling task (tests; a server simply exits)."""
        if self.listener is not None:
            await self.loop.run_in_executor(None, self.listener.stop)
            self.listener = None
        if self.task is not None:
            self.task.cancel()
            try:
                await self.task
            except asyncio.CancelledError:
                pass
        self.executor.shutdown(wait=True)

    def poke(self) -> None:
        """From any thread: a commit in this process journaled something."""
        self.loop.call_soon_threadsafe(self.wake.set)

    def _start_at(self) -> SeenIds:
        top = Event.objects.aggregate(top=Max("id"))["top"] or 0
        return SeenIds(context.trailing_window(), top)

    async def run(self) -> None:
        from channels.layers import get_channel_layer

        layer = get_channel_layer()
        assert layer is not None
        # On PostgreSQL the journal's NOTIFY wakes it (`Listener`), and a slow look is only in
        # case a notice was lost; on SQLite it looks every POLL_SECONDS. Never more often
        # than that either way: a busy worker's notices are taken together.
        waits = settings.LOOP_LIVE_PG_POLL_MS / 1000 if self.listener else POLL_SECONDS
        unsent: list[tuple[str, dict[str, Any]]] = []
        while True:
            try:
                await asyncio.wait_for(self.wake.wait(), waits)
            except TimeoutError:
                pass
            if self.listener:
                await asyncio.sleep(POLL_SECONDS)
            self.wake.clear()
            topics = list(self.topics)
            try:
                out = await self.loop.run_in_executor(self.executor, self.poll, topics)
            except Exception as exc:
                self.outage.failed("reading the journal", exc)
                await asyncio.sleep(1)
                continue
            self.outage.ended("reading the journal")
            unsent = await self.send(layer, unsent + out)
            if unsent:
                self.wake.set()  # try again after the pause `send` took, not at the next look

    async def send(
        self, layer: Any, out: list[tuple[str, dict[str, Any]]]
    ) -> list[tuple[str, dict[str, Any]]]:
        """Each message to its group, in order. Those a failed send left (the Redis layer
        restarting) come back, to go first at the next pass, so a page whose socket stayed
        open misses nothing (it drops what it already has); at most the newest UNSENT are
        kept through a long outage. A page whose socket broke reconnects and replays from
        its own last id."""
        for n, (group, message) in enumerate(out):
            try:
                await layer.group_send(group, {"type": "live.push", "message": message})
            except Exception as exc:
                self.outage.failed("sending to the pages", exc)
                await asyncio.sleep(1)
                return out[n:][-UNSENT:]
        if out:
            self.outage.ended("sending to the pages")
        return []

    def poll(self, topics: list[Topic]) -> list[tuple[str, dict[str, Any]]]:
        """In the tailer's thread: new events → one message per followed topic."""
        assert self.seen is not None
        try:
            floor = self.seen.top - self.seen.window
            rows = Event.objects.filter(id__gt=floor).order_by("id")[:BATCH]
            events = [e for e in rows if e.pk not in self.seen]
            self.seen.add(e.pk for e in events)
            out = []
            for topic in topics:
                mine = [e for e in events if topic.wants(e)]
                if mine:
                    out.append((topic.group, render(topic, mine)))
            out.extend(self._banner(topics, events))
            return out
        except DatabaseError:
            connection.close()  # a fresh connection next time
            raise

    def _banner(self, topics: list[Topic], events: list[Event]) -> list[tuple[str, dict[str, Any]]]:
        """Worker health changes without events too (a heartbeat goes stale): re-check the
        banner every few seconds and push it when it changed."""
        homes = [t for t in topics if t.page == "home"]
        now = time.monotonic()
        if not homes or now - self.banner_at < BANNER_SECONDS:
            return []
        self.banner_at = now
        swap = banner_swap()
        if swap["html"] == self.banner:
            return []
        self.banner = swap["html"]
        return [(t.group, {"events": [], "swaps": [swap], "rows": []}) for t in homes]


class Outage:
    """Says a failure once when it begins (with its traceback: it may be a bug) and once when
    it ends, not once a second while the database or Redis is down."""

    def __init__(self, who: str) -> None:
        self.who = who
        self.failing: set[str] = set()

    def failed(self, doing: str, exc: BaseException) -> None:
        if doing not in self.failing:
            self.failing.add(doing)
            log.warning("%s: %s failed; trying again every second", self.who, doing, exc_info=exc)

    def ended(self, doing: str) -> None:
        if doing in self.failing:
            self.failing.discard(doing)
            log.info("%s: %s works again", self.who, doing)


class Listener:
    """PostgreSQL: a thread with a connection of its own that LISTENs on the journal's channel
    (`journal.NOTIFY_CHANNEL`, notified by every commit that journaled) and wakes the tailer
    at each notice, so the tailer need not poll. A lost connection is made again (the tailer
    is woken then too: what committed meanwhile is read at once)."""

    def __init__(self, wake: Callable[[], None]) -> None:
        self.wake = wake
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.run, name="live-listen", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=5)

    def run(self) -> None:
        import psycopg

        # Django's own connection parameters (its OPTIONS too: sslmode, …), without the
        # adapters and cursors it sets up for its connections: this one only listens.
        params = connection.get_connection_params()
        for own in ("context", "cursor_factory", "prepare_threshold"):
            params.pop(own, None)
        outage = Outage("live listener")
        while not self.stopping.is_set():
            try:
                with psycopg.connect(**params, autocommit=True) as listening:
                    listening.execute(f"LISTEN {journal.NOTIFY_CHANNEL}")
                    outage.ended("listening")
                    self.wake()
                    while not self.stopping.is_set():
                        for _ in listening.notifies(timeout=1.0):
                            self.wake()
            except Exception as exc:
                outage.failed("listening", exc)
                self.stopping.wait(1.0)


_tailer: Tailer | None = None


def tailer() -> Tailer:
    """This process's tailer, bound to the running event loop."""
    global _tailer
    loop = asyncio.get_running_loop()
    if _tailer is None or _tailer.loop is not loop or loop.is_closed():
        _tailer = Tailer(loop)
    return _tailer


def _on_commit() -> None:
    current = _tailer
    if current is not None and not current.loop.is_closed():
        current.poke()


journal.on_event(_on_commit)
