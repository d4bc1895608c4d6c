"""The Schedules page: each schedule in words with its next three runs, an on/off switch, Run
now, its times edited in place, and its latest runs with their tasks (`loop.schedules`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_POST

from ... import actions, cron, permissions, plans, schedules
from ...models import Schedule, ScheduleRun, Task
from . import context
from .respond import actor, answer

RUNS_SHOWN = 10


@dataclass
class Card:
    schedule: Schedule
    words: str
    upcoming: list[datetime]
    runs: list[tuple[ScheduleRun, Task | None]]


def _cards() -> list[Card]:
    now = timezone.now()
    cards = []
    for schedule in Schedule.objects.order_by("name"):
        try:
            upcoming = cron.next_runs(schedule.cron, schedule.timezone, now)
        except ValueError:
            upcoming = []
        runs = list(schedule.runs.order_by("-due_at")[:RUNS_SHOWN])
        tasks = {t.origin_run_id: t for t in Task.objects.filter(origin_run__in=runs)}
        cards.append(
            Card(
                schedule,
                cron.in_words(schedule.cron, schedule.timezone),
                upcoming if schedule.enabled else [],
                [(run, tasks.get(run.pk)) for run in runs],
            )
        )
    return cards


@login_required
@require_http_methods(["GET", "HEAD"])
def schedules_page(request: HttpRequest) -> HttpResponse:
    return render(
        request,
        "loop/schedules.html",
        {
            "cards": _cards(),
            "can_edit": permissions.may(request.user, "edit a schedule"),
            "waiting": context.waiting_count(),
        },
    )


def _change(
    request: HttpRequest, schedule_id: int, changes: dict[str, Any], said: str
) -> HttpResponse:
    back = reverse("loop:schedules") + f"#schedule-{schedule_id}"
    try:
        schedules.edit(
            schedule_id=schedule_id, changes=changes, actor=actor(request), user=request.user
        )
    except PermissionDenied as exc:
        return answer(request, str(exc), status=403, fallback=back)
    except plans.PlanError as exc:
        return answer(request, "; ".join(exc.errors), status=400, fallback=back)
    except actions.Refused as exc:
        return answer(request, str(exc), status=409, fallback=back)
    return answer(request, said, fallback=back)


@require_POST
@login_required
def switch(request: HttpRequest, schedule_id: int) -> HttpResponse:
    schedule = get_object_or_404(Schedule, pk=schedule_id)
    on = request.POST.get("enabled") == "on"
    said = f"'{schedule.name}' is {'on' if on else 'off'}."
    return _change(request, schedule.pk, {"enabled": on}, said)


@require_POST
@login_required
def edit(request: HttpRequest, schedule_id: int) -> HttpResponse:
    schedule = get_object_or_404(Schedule, pk=schedule_id)
    changes = {
        name: request.POST[name].strip()
        for name in ("name", "cron", "timezone")
        if isinstance(request.POST.get(name), str)
    }
    return _change(
        request, schedule.pk, changes, f"Saved '{changes.get('name') or schedule.name}'."
    )


@require_POST
@login_required
def run_now(request: HttpRequest, schedule_id: int) -> HttpResponse:
    schedule = get_object_or_404(Schedule, pk=schedule_id)
    back = reverse("loop:schedules") + f"#schedule-{schedule.pk}"
    try:
        run = schedules.run_now(schedule_id=schedule.pk, actor=actor(request), user=request.user)
    except PermissionDenied as exc:
        return answer(request, str(exc), status=403, fallback=back)
    except actions.Refused as exc:
        return answer(request, str(exc), status=409, fallback=back)
    if run.error:
        return answer(
            request, f"'{schedule.name}' did not start: {run.error}", status=409, fallback=back
        )
    return answer(request, f"Started '{schedule.name}' now.", fallback=back)
