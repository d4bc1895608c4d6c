"""The conversation page: the messages, a box to write in, and the schedules with their next
due time and last run. Live over the same WebSocket feed (topic "conversation")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from ... import actions, conversation, plans, turns
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
        m.schedule_card = schedule_card(m.proposed_schedule)  # type: ignore[attr-defined]


def schedule_card(plan: Any) -> dict[str, Any] | None:
    """A proposed schedule as its card shows it: title, cron, zone, and each step's title and
    what does it (its tool, or Pippa)."""
    if not isinstance(plan, dict):
        return None
    steps = [s for s in plan.get("steps") or [] if isinstance(s, dict)]
    return {
        "title": str(plan.get("title", "")),
        "cron": str(plan.get("schedule", "")),
        "zone": str(plan.get("timezone") or "the site's zone"),
        "steps": [
            (str(s.get("title") or s.get("key", "")), str(s.get("tool") or "Pippa")) for s in steps
        ],
    }


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


@login_required
@require_POST
def answer_schedule(request: HttpRequest, message_id: int) -> HttpResponse:
    """Dad's one click on a schedule Pippa proposed: `decision` approve (it is created as his)
    or decline."""
    page = reverse("loop:conversation")
    decision = request.POST.get("decision")
    if decision not in ("approve", "decline"):
        return answer(request, "decision: approve or decline", status=400, fallback=page)
    try:
        if decision == "approve":
            made = turns.approve_schedule(
                message_id=message_id, actor=actor(request), user=request.user
            )
            said = f"Schedule '{made.name}' approved: it runs at its next due time."
        else:
            turns.decline_schedule(message_id=message_id, actor=actor(request), user=request.user)
            said = "Schedule declined: nothing was made."
    except PermissionDenied as exc:
        return answer(request, str(exc), status=403, fallback=page)
    except (actions.Refused, plans.PlanError) as exc:
        return answer(request, f"schedule: {exc}", status=409, fallback=page)
    return answer(request, said, fallback=page)
