"""The conversation page: the messages, a box to write in, and the schedules with their next
due time and last run. Live over the same WebSocket feed (topic "conversation")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from ... import conversation, turns
from ...models import Message, Origin, Schedule, ScheduleRun, Task
from . import context
from .respond import actor, answer, can_act

SHOWN = 200  # the latest messages on the page


@dataclass
class ScheduleRow:
    schedule: Schedule
    last: ScheduleRun | None
    last_task: int | None


def schedule_rows() -> list[ScheduleRow]:
    rows = []
    for schedule in Schedule.objects.order_by("name"):
        last = schedule.runs.order_by("-due_at").first()
        task = last.tasks.values_list("pk", flat=True).first() if last else None
        rows.append(ScheduleRow(schedule, last, task))
    return rows


def page_context() -> dict[str, Any]:
    """What the page and its live pushes render (`loop/web/live.py` calls this too)."""
    shown: list[Message] = conversation.history(limit=SHOWN)
    cards(shown)
    return {
        "talk": shown,
        "latest_message": shown[-1].pk if shown else None,
        "schedules": schedule_rows(),
    }


def cards(shown: list[Message]) -> None:
    """Each message's card, as attributes the page reads: a schedule's run links its task
    (`run_task`), Pippa's proposal shows its plan and Dad's two buttons while it waits
    (`card`, `proposed`). Two lookups for the page."""
    runs = dict(
        Task.objects.filter(origin_message_id__in=[m.pk for m in shown])
        .exclude(origin=Origin.CONVERSATION)
        .values_list("origin_message_id", "pk")
    )
    proposed = {
        t.pk: t for t in Task.objects.filter(pk__in=[m.proposal_id for m in shown if m.proposal_id])
    }
    for m in shown:
        task = proposed.get(m.proposal_id) if m.proposal_id else None
        m.run_task = runs.get(m.pk)  # type: ignore[attr-defined]
        m.proposed = task  # type: ignore[attr-defined]
        m.card = context.proposal_of(task) if task is not None else None  # type: ignore[attr-defined]


@login_required
@require_http_methods(["GET", "HEAD", "POST"])
def conversation_page(request: HttpRequest) -> HttpResponse:
    """GET shows the conversation; POST writes Dad's message (ending any schedule's standing
    authorization) and shows the page again."""
    if request.method == "POST":
        try:
            turns.post(author=actor(request), text=request.POST.get("text", ""), user=request.user)
        except PermissionDenied as exc:
            return answer(request, str(exc), status=403, fallback="/conversation")
        except conversation.MessageError as exc:
            return answer(request, str(exc), status=400, fallback="/conversation")
        return redirect("loop:conversation")
    last = context.last_event_id()
    return render(
        request,
        "loop/conversation.html",
        {
            **page_context(),
            "can_act": can_act(request),
            "waiting": context.waiting_count(),
            "last_event": last,
            "seen_events": context.seen_near(last),
            "topic": "conversation",
        },
    )
