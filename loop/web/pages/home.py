"""The home page ("Needs you", running tasks, recent tasks) and the new-task page."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from ... import actions, cron, plans, schedules
from ...models import Origin
from ..forms import NewTaskForm
from . import context
from .respond import actor, answer, can_act


@login_required
@require_http_methods(["GET", "HEAD"])
def home(request: HttpRequest) -> HttpResponse:
    last = context.last_event_id()
    page = context.home(can_act=can_act(request))
    return render(
        request,
        "loop/home.html",
        {**page, "last_event": last, "seen_events": context.seen_near(last), "topic": "home"},
    )


@login_required
@require_http_methods(["GET", "HEAD", "POST"])
def new_task(request: HttpRequest) -> HttpResponse:
    """GET shows the form; POST creates the task from a pasted or uploaded plan, or from a
    goal that Pippa plans. An invalid plan or goal is shown again with its errors beside the
    field, and nothing is created."""
    form = NewTaskForm()
    status = 200
    if request.method == "POST":
        form = NewTaskForm(request.POST, request.FILES)
        if form.is_valid() and form.cleaned_data.get("goal"):
            try:
                task = actions.create_task_from_goal(
                    goal=form.cleaned_data["goal"],
                    actor=actor(request),
                    user=request.user,
                    origin=Origin.DASHBOARD,
                )
            except PermissionDenied as exc:
                return answer(request, str(exc), status=403)
            except plans.PlanError as exc:
                form.add_error("goal", exc.errors)
            else:
                return redirect("loop:task", task_id=task.pk)
        elif form.is_valid():
            spec = form.cleaned_data["spec"]
            try:
                if spec.schedule is not None:
                    made = schedules.create(spec=spec, actor=actor(request), user=request.user)
                    words = cron.in_words(made.cron, made.timezone)
                    messages.success(request, f"Schedule '{made.name}' made: it runs {words}.")
                    return redirect(reverse("loop:schedules") + f"#schedule-{made.pk}")
                task = actions.create_task(
                    plan=spec, actor=actor(request), user=request.user, origin=Origin.DASHBOARD
                )
            except PermissionDenied as exc:
                return answer(request, str(exc), status=403)
            except actions.Refused as exc:
                return answer(request, str(exc), status=400)
            return redirect("loop:task", task_id=task.pk)
        status = 400
    return render(
        request,
        "loop/new_task.html",
        {"form": form, "can_act": can_act(request), "waiting": context.waiting_count()},
        status=status,
    )
