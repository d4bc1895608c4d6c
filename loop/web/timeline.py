"""The task page's timeline picture: each step's attempts over time, colored by outcome.

Built from the journal alone (step_started/step_restarted open an attempt; step_done,
step_retry, step_failed and step_blocked close it), so it shows what happened, not what the
step's row says now. `build()` is pure; `loop/task.html#timeline` draws the SVG.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from django.utils import timezone

from ..models import EventKind
from ..templatetags.clock import length

WIDTH = 760  # viewBox units; the SVG scales to its box (never below its CSS min-width)
LABEL = 150  # left column for step keys
RIGHT = 170  # right margin for the last bar's duration
TICKS = 4  # the axis's intervals
ROW = 24
BAR = 14
TOP = 8
AXIS = 22
LIFECYCLE = frozenset(
    {
        EventKind.STEP_STARTED,
        EventKind.STEP_RESTARTED,
        EventKind.STEP_DONE,
        EventKind.STEP_RETRY,
        EventKind.STEP_FAILED,
        EventKind.STEP_BLOCKED,
        EventKind.STEP_UNBLOCKED,
    }
)
CLOSES: dict[str, str] = {
    EventKind.STEP_DONE: "done",
    EventKind.STEP_RETRY: "retry",
    EventKind.STEP_FAILED: "failed",
    EventKind.STEP_BLOCKED: "blocked",
}


@dataclass(frozen=True)
class Mark:
    """What the timeline needs of one journal event."""

    kind: str
    step_id: int | None
    at: datetime
    actor: str = ""


@dataclass
class Span:
    start: datetime
    end: datetime | None
    outcome: str  # done, retry, failed, blocked, cut, running, waiting
    attempt: int = 0
    actor: str = ""
    # Geometry as text: numbers would be localized by the template, one by one.
    x: str = ""
    width: str = ""
    label: str = ""


@dataclass
class Row:
    step_id: int
    key: str
    spans: list[Span] = field(default_factory=list)
    short: str = ""
    y: int = 0
    text_y: str = ""
    lane_y: str = ""
    bar_y: str = ""
    said: str = ""  # how long it ran, and waited for Dad: "1.2 s · waited 48 s for you"
    said_x: str = ""


@dataclass
class Timeline:
    rows: list[Row]
    height: int
    start: datetime | None
    end: datetime | None
    width: str = str(WIDTH)
    label: str = str(LABEL)
    bar: str = str(BAR)
    end_x: str = str(WIDTH - 4)
    ticks: list[tuple[str, str]] = field(default_factory=list)  # (x, "+1.2 s")
    length: str = ""

    @property
    def axis_y(self) -> str:
        return str(self.height - 6)

    @property
    def grid_y(self) -> str:
        return str(self.height - AXIS + 4)

    @property
    def empty(self) -> bool:
        return not any(row.spans for row in self.rows)


def build(steps: Sequence[tuple[int, str]], marks: Iterable[Mark], now: datetime) -> Timeline:
    """`steps`: (id, key) in plan order; `marks`: the task's lifecycle events in id order."""
    rows = {step_id: Row(step_id, key) for step_id, key in steps}
    open_attempt: dict[int, Span] = {}
    waiting: dict[int, Span] = {}
    for mark in marks:
        row = rows.get(mark.step_id or -1)
        if row is None or mark.kind not in LIFECYCLE:
            continue
        sid = row.step_id
        if mark.kind in (EventKind.STEP_STARTED, EventKind.STEP_RESTARTED):
            previous = open_attempt.pop(sid, None)
            if previous is not None:  # opened and never closed: the run was cut
                previous.end, previous.outcome = mark.at, "cut"
            attempt = sum(1 for s in row.spans if s.outcome != "waiting") + 1
            span = Span(mark.at, None, "running", attempt, mark.actor)
            row.spans.append(span)
            open_attempt[sid] = span
        elif mark.kind in CLOSES:
            span_or_none = open_attempt.pop(sid, None)
            if span_or_none is not None:
                # Closed by someone other than the worker that started it: no verdict was
                # recorded, a later worker found the run cut (and asked, or gave up).
                cut = mark.actor != span_or_none.actor
                span_or_none.end = mark.at
                span_or_none.outcome = "cut" if cut else CLOSES[mark.kind]
            if mark.kind == EventKind.STEP_BLOCKED:
                wait = Span(mark.at, None, "waiting")
                row.spans.append(wait)
                waiting[sid] = wait
            elif mark.kind == EventKind.STEP_FAILED and sid in waiting:
                waiting.pop(sid).end = mark.at
        elif mark.kind == EventKind.STEP_UNBLOCKED and sid in waiting:
            waiting.pop(sid).end = mark.at
    spans = [s for row in rows.values() for s in row.spans]
    if not spans:
        return Timeline(list(rows.values()), TOP + AXIS, None, None)
    start = min(s.start for s in spans)
    end = max([now] if open_attempt or waiting else [s.end or s.start for s in spans])
    total = max((end - start).total_seconds(), 0.001)
    scale = (WIDTH - LABEL - RIGHT) / total
    # Everything the SVG needs is computed here: template filters in a loop of hundreds of
    # rows are what makes a large task's timeline slow to render.
    for index, row in enumerate(rows.values()):
        row.y = TOP + index * ROW
        row.short = row.key if len(row.key) <= 20 else row.key[:19] + "…"
        row.text_y, row.lane_y, row.bar_y = str(row.y + 15), str(row.y + 11), str(row.y + 4)
        for span in row.spans:
            finish = span.end or now
            span.x = f"{LABEL + (span.start - start).total_seconds() * scale:.1f}"
            span.width = f"{max((finish - span.start).total_seconds() * scale, 3):.1f}"
            nth = f" attempt {span.attempt}" if span.attempt else ""
            took = length((finish - span.start).total_seconds())
            at = f"{timezone.localtime(span.start):%H:%M:%S}"
            span.label = f"{row.key}{nth}: {span.outcome} at {at}, {took}"
        row.said = _said(row.spans, now)
        if row.spans:
            last = max(s.end or now for s in row.spans)
            row.said_x = f"{LABEL + (last - start).total_seconds() * scale + 4:.1f}"
    ticks = [
        (f"{LABEL + n * (WIDTH - LABEL - RIGHT) / TICKS:.1f}", f"+{length(total * n / TICKS)}")
        for n in range(TICKS + 1)
    ]
    ticks[0] = (ticks[0][0], f"{timezone.localtime(start):%H:%M:%S}")
    return Timeline(
        list(rows.values()),
        TOP + len(rows) * ROW + AXIS,
        start,
        end,
        ticks=ticks,
        length=length(total),
    )


def _said(spans: list[Span], now: datetime) -> str:
    ran = sum(((s.end or now) - s.start).total_seconds() for s in spans if s.outcome != "waiting")
    waited = sum(
        ((s.end or now) - s.start).total_seconds() for s in spans if s.outcome == "waiting"
    )
    parts = [length(ran)] if any(s.outcome != "waiting" for s in spans) else []
    if waited:
        parts.append(f"waited {length(waited)} for you")
    return " · ".join(parts)
