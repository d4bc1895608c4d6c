"""The notifier (DESIGN.md §17): a thread of the worker process that follows the journal, as
the live pages' tailer does, and sends the news it finds on each channel.

- At least once: each channel has a cursor row (`NotifyCursor`) that moves past the events of a
  batch only once the batch went out; a failed send is tried again, with backoff.
- Grouped, never a flood: the first news waits LOOP_NOTIFY_GATHER seconds for the rest of its
  burst, and a channel sends at most once every LOOP_NOTIFY_EVERY seconds: whatever came
  meanwhile goes out together, one message, at most `news.MAX_ITEMS` listed.
- Reminders: a question still unanswered LOOP_REMIND_AFTER seconds after it was asked (or last
  reminded) is told again, at most LOOP_REMIND_TIMES times.
- No side effect of a task: it reads the journal and the rows, writes only its own rows, and a
  failure here never touches the loop (it is logged, and tried again).

A fresh cursor starts at the newest event: history from before the first start is no news.
On PostgreSQL an event id can commit after a higher one; the cursor moves only past events
older than SETTLE seconds, so one committed that late is the only kind that could be missed."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection, connections, transaction
from django.db.models import F, Max, Q
from django.utils import timezone

from ..models import Event, NotifyCursor, QuestionNotice, Step, StepState, Worker, WorkerState
from . import channels, news
from .news import News

log = logging.getLogger("loop.notify")
BATCH = 500
SETTLE_PG = 2.0
BACKOFF_MAX = 300.0
SAVE_EVERY = 10.0


def _settle() -> float:
    return 0.0 if connection.vendor == "sqlite" else SETTLE_PG


def leads(worker_id: int) -> bool:
    """Whether this worker is the one whose notifier speaks: the oldest live worker (the lowest
    id running or parked), so that N workers send one message, not N. A leader that dies keeps
    the part until it is found dead (at once on its machine, else LOOP_WORKER_DEAD_AFTER)."""
    first = (
        Worker.objects.filter(state__in=[WorkerState.RUNNING, WorkerState.PARKED])
        .order_by("pk")
        .values_list("pk", flat=True)
        .first()
    )
    return first == worker_id


class Notifier:
    def __init__(
        self, chans: Sequence[Any] | None = None, *, worker: Callable[[], int] | None = None
    ) -> None:
        self.channels = list(chans if chans is not None else channels.CHANNELS)
        self.worker = worker  # this worker's id now (None: always speaks)
        self.pending_since: dict[str, float] = {}
        self.last_sent: dict[str, float] = {}
        self.fails: dict[str, int] = {}
        self.retry_at: dict[str, float] = {}
        # How far each channel read with nothing to tell: kept here, written to its cursor row
        # at most every SAVE_EVERY seconds (a restart reads that stretch again, and finds no
        # news in it again), so a busy journal does not cost a write a second.
        self.position: dict[str, int] = {}
        self.saved_at: dict[str, float] = {}
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None

    # ---- the thread ------------------------------------------------------------------------

    def start(self) -> None:
        self.thread = threading.Thread(target=self.run, name="notifier", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(timeout=15)

    def run(self) -> None:
        try:
            channels.vapid_public_key()  # Web Push's key pair, made at the first start
        except Exception:
            log.exception("notifier: the Web Push key pair could not be made")
        try:
            while not self.stop.wait(settings.LOOP_NOTIFY_POLL):
                try:
                    self.pass_once()
                except DatabaseError as exc:
                    log.warning("notifier: reading the journal failed: %s", exc)
                    connections.close_all()
                except Exception:  # a bug must not stop the worker: say it, go on
                    log.exception("notifier pass failed")
        finally:
            connections.close_all()

    # ---- one pass --------------------------------------------------------------------------

    def pass_once(self) -> dict[str, int]:
        """Each channel's news sent if due, then reminders: how many pieces each channel sent."""
        sent: dict[str, int] = {}
        if self.worker is not None and not leads(self.worker()):
            self.pending_since.clear()
            self.position.clear()  # another worker's notifier moves the cursors meanwhile
            return sent
        for channel in self.channels:
            if channel.enabled():
                sent[channel.name] = self.follow(channel)
        sent["reminders"] = self.remind()
        return sent

    def _cursor(self, name: str) -> NotifyCursor:
        cursor = NotifyCursor.objects.filter(channel=name).first()
        if cursor is None:
            top = Event.objects.aggregate(top=Max("id"))["top"] or 0
            cursor, _ = NotifyCursor.objects.get_or_create(
                channel=name, defaults={"last_event": top}
            )
        return cursor

    def follow(self, channel: Any) -> int:
        name = channel.name
        now = time.monotonic()
        if now < self.retry_at.get(name, 0.0):
            return 0
        start = max(self._cursor(name).last_event, self.position.get(name, 0))
        rows = Event.objects.filter(id__gt=start)
        settle = _settle()
        if settle:
            rows = rows.filter(created_at__lte=timezone.now() - timedelta(seconds=settle))
        ids = list(rows.order_by("id").values_list("id", flat=True)[:BATCH])
        if not ids:
            return 0
        upto = ids[-1]
        events = list(Event.objects.filter(id__in=ids, kind__in=news.NOTABLE).order_by("id"))
        if not events:
            self._passed(name, upto, now)
            return 0
        # The news is read only once it is due: a burst waiting to go costs one cheap read of
        # ids a pass, not a rendering of every question in it.
        first = self.pending_since.setdefault(name, now)
        if now - first < settings.LOOP_NOTIFY_GATHER:
            return 0
        if now - self.last_sent.get(name, -1e9) < settings.LOOP_NOTIFY_EVERY:
            return 0
        found = news.of_events(events)
        if not found:  # answered, decided or gone meanwhile
            self._passed(name, upto, now)
            return 0
        if not self._deliver(channel, found, now):
            return 0
        self._advance(name, upto)
        self.position[name] = upto
        self.saved_at[name] = now
        self._noticed(found)
        self.pending_since.pop(name, None)
        return len(found)

    def _passed(self, name: str, upto: int, now: float) -> None:
        """Events up to `upto` held nothing to tell."""
        self.position[name] = upto
        self.pending_since.pop(name, None)
        if now - self.saved_at.get(name, -1e9) >= SAVE_EVERY:
            self._advance(name, upto)
            self.saved_at[name] = now

    def _deliver(self, channel: Any, found: Sequence[News], now: float) -> bool:
        name = channel.name
        try:
            channel.send(found)
        except channels.NotSent as exc:
            fails = self.fails[name] = self.fails.get(name, 0) + 1
            wait = min(2.0**fails, BACKOFF_MAX)
            self.retry_at[name] = now + wait
            log.warning("notifier: %s; trying again in %.0f s", exc, wait)
            return False
        if self.fails.pop(name, 0):
            log.info("notifier: %s works again", name)
        self.last_sent[name] = now
        log.info("notifier: %s sent %d piece(s) of news", name, len(found))
        return True

    def _advance(self, name: str, upto: int) -> None:
        NotifyCursor.objects.filter(channel=name, last_event__lt=upto).update(
            last_event=upto, updated_at=timezone.now()
        )

    def _noticed(self, found: Sequence[News]) -> None:
        """The questions told of, for their reminders: a question asked again starts afresh."""
        for item in found:
            if item.kind != "question" or item.step_id is None:
                continue
            step = Step.objects.filter(pk=item.step_id).first()
            event = news.asked_event(step) if step is not None else None
            if step is None or event is None:
                continue
            with transaction.atomic():
                notice = QuestionNotice.objects.select_for_update().filter(step=step).first()
                if notice is None:
                    QuestionNotice.objects.create(
                        step=step, asked_event=event.pk, asked_at=event.created_at
                    )
                elif notice.asked_event != event.pk:
                    notice.asked_event, notice.asked_at = event.pk, event.created_at
                    notice.reminded, notice.reminded_at = 0, None
                    notice.save()

    # ---- reminders -------------------------------------------------------------------------

    def remind(self) -> int:
        if not settings.LOOP_REMIND_TIMES:
            return 0
        now = time.monotonic()
        if now < self.retry_at.get("reminders", 0.0):
            return 0
        due_at = timezone.now() - timedelta(seconds=settings.LOOP_REMIND_AFTER)
        due = list(
            QuestionNotice.objects.filter(
                step__state=StepState.BLOCKED, reminded__lt=settings.LOOP_REMIND_TIMES
            )
            .filter(Q(reminded_at__isnull=True, asked_at__lte=due_at) | Q(reminded_at__lte=due_at))
            .select_related("step__task")
            .order_by("asked_at")
        )
        found: list[News] = []
        told: list[QuestionNotice] = []
        for notice in due:
            event = news.asked_event(notice.step)
            if event is None or event.pk != notice.asked_event:
                continue  # asked again since: the new asking is told as news
            item = news.question_news(notice.step, kind="reminder")
            if item is not None:
                found.append(item)
                told.append(notice)
        if not found:
            return 0
        ok = True
        for channel in self.channels:
            if channel.enabled():
                try:
                    channel.send(found)
                except channels.NotSent as exc:
                    log.warning("notifier: reminder: %s", exc)
                    ok = False
        if not ok:
            fails = self.fails["reminders"] = self.fails.get("reminders", 0) + 1
            self.retry_at["reminders"] = now + min(2.0**fails, BACKOFF_MAX)
            return 0
        self.fails.pop("reminders", None)
        QuestionNotice.objects.filter(pk__in=[n.pk for n in told]).update(
            reminded=F("reminded") + 1, reminded_at=timezone.now()
        )
        return len(found)
