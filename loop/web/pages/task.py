"""The task page: plan, steps, effects and receipts, the journal, the timeline; add steps and
supersede (plain form posts whose errors are shown beside their fields)."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from ... import actions, numbers, plans
from ...models import EventKind, Origin, Step, Task
from ..forms import AddStepsForm, PlanForm
from . import context, transcript_view
from .respond import actor, answer, can_act

MAX_POSITION = 2**31 - 1  # a step's position is a 32-bit integer column
MAX_ID = 2**63 - 1


def _page(
    request: HttpRequest,
    task: Task,
    *,
    add_form: AddStepsForm | None = None,
    supersede_form: PlanForm | None = None,
    status: int = 200,
    start: int | None = None,
    journal_step: int | None = None,
    journal_kind: str = "",
) -> HttpResponse:
    last = context.last_event_id()
    page = context.task_page(
        task,
        can_act=can_act(request),
        start=start,
        journal_step=journal_step,
        journal_kind=journal_kind,
    )
    return render(
        request,
        "loop/task.html",
        {
            **page,
            "last_event": last,
            "seen_events": context.seen_near(last),
            "topic": f"task-{task.pk}",
            "add_form": add_form or AddStepsForm(keys=page["all_keys"]),
            "supersede_form": supersede_form or PlanForm(),
        },
        status=status,
    )


@login_required
@require_http_methods(["GET", "HEAD"])
def task_page(request: HttpRequest, task_id: int) -> HttpResponse:
    """`?from=POSITION` shows the window of steps that begins there (default: around the
    current step)."""
    task = get_object_or_404(Task, pk=task_id)
    start = request.GET.get("from")
    try:
        position = None if start is None else numbers.whole(start, "from", low=0, high=MAX_POSITION)
    except numbers.NotANumber as exc:
        return HttpResponseBadRequest(f"{exc} (a step position)", content_type="text/plain")
    step, kind = request.GET.get("step") or "", request.GET.get("kind") or ""
    if kind and kind not in EventKind.values:
        return HttpResponseBadRequest(
            f"kind: no kind of event '{kind[:40]}'", content_type="text/plain"
        )
    try:
        step_id = numbers.whole(step, "step", low=1, high=MAX_ID) if step else None
    except numbers.NotANumber as exc:
        return HttpResponseBadRequest(f"{exc} (a step's id)", content_type="text/plain")
    return _page(request, task, start=position, journal_step=step_id, journal_kind=kind)


@login_required
@require_http_methods(["GET", "HEAD"])
def step_transcript(request: HttpRequest, step_id: int) -> HttpResponse:
    """A model step's whole transcript (its card on the task page shows the latest entries)."""
    step = get_object_or_404(Step, pk=step_id)
    return render(
        request,
        "loop/transcript_page.html",
        {"step": step, "t": transcript_view.of_step(step), "waiting": context.waiting_count()},
    )


@require_POST
@login_required
def add_steps(request: HttpRequest, task_id: int) -> HttpResponse:
    task = get_object_or_404(Task, pk=task_id)
    keys = list(task.steps.order_by("position").values_list("key", flat=True))
    form = AddStepsForm(request.POST, keys=keys)
    if form.is_valid():
        try:
            added = actions.add_steps(
                task_id=task.pk,
                steps=form.cleaned_data["steps"],
                after=form.cleaned_data["after"] or None,
                actor=actor(request),
                user=request.user,
            )
        except PermissionDenied as exc:
            return answer(request, str(exc), status=403)
        except plans.PlanError as exc:
            form.add_error("steps", exc.errors)
        except actions.Refused as exc:
            form.add_error("after", str(exc))
        else:
            return answer(request, f"Added {len(added)} step(s).", fallback=task_url(task))
    task.refresh_from_db()
    return _page(request, task, add_form=form, status=400)


@require_POST
@login_required
def supersede(request: HttpRequest, task_id: int) -> HttpResponse:
    task = get_object_or_404(Task, pk=task_id)
    form = PlanForm(request.POST, request.FILES)
    if form.is_valid():
        try:
            successor = actions.supersede(
                task_id=task.pk,
                plan=form.cleaned_data["spec"],
                actor=actor(request),
                user=request.user,
                origin=Origin.DASHBOARD,
            )
        except PermissionDenied as exc:
            return answer(request, str(exc), status=403)
        except actions.Refused as exc:
            form.add_error(None, f"state: {exc}")
        else:
            return redirect("loop:task", task_id=successor.pk)
    task.refresh_from_db()
    return _page(request, task, supersede_form=form, status=400)


def task_url(task: Task) -> str:
    from django.urls import reverse

    return reverse("loop:task", args=[task.pk])
