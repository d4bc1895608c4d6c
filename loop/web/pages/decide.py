"""Answers to "May I do this?" and "Did this happen?", pause / resume, and approving the plan
Pippa wrote (LOOP_CONFIRM_PLANS)."""

from __future__ import annotations

from collections.abc import Callable

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404
from django.urls import reverse
from django.views.decorators.http import require_POST

from ... import actions, lease, plans
from ...models import Event, EventKind, Step, Task
from ...templatetags import clock
from .. import answers
from ..forms import DecisionForm
from .respond import actor, answer

SAID = {
    "allow": "Allowed once{how}: '{key}' runs in a moment.",
    "allow_held": "Allowed once{how}: '{key}' runs when {holder} takes it up, or its lease ends "
    "at {until}.",
    "deny": "Denied: '{key}' failed; its task is paused, waiting for a replacement.",
    "deny_model": "Denied: Pippa is told your reason and goes on with '{key}'.",
    "reply": "Sent to Pippa: '{key}' still waits for your answer.",
    "reply_model": "Sent to Pippa: '{key}' goes on with your words; she asks again if she must.",
    "happened": "Noted that it happened: '{key}' finishes from that receipt.",
    "rerun": "'{key}' will do it again.",
    "fail": "'{key}' failed.",
}
EDITED = ", as you edited it"
UNEDITED = ", as it was (your edit changed nothing)"


@require_POST
@login_required
def decide(request: HttpRequest, step_id: int) -> HttpResponse:
    step = get_object_or_404(Step, pk=step_id)
    home = reverse("loop:home")
    form = DecisionForm(request.POST)
    if not form.is_valid():
        field, errors = next(iter(form.errors.items()))
        return answer(
            request, f"{field}: {' '.join(str(e) for e in errors)}", status=400, fallback=home
        )
    decision = form.cleaned_data["decision"]
    note = form.cleaned_data["note"].strip()
    try:
        edited = answers.edited_args(step, request.POST) if request.POST.get("edit") else None
        actions.unblock(
            step_id=step.pk,
            decision=decision,
            actor=actor(request),
            user=request.user,
            note=note,
            args=edited,
        )
    except (ValueError, plans.PlanError) as exc:  # a field's JSON, or the tool's check
        return answer(request, str(exc), status=400, fallback=home)
    except PermissionDenied as exc:
        return answer(request, str(exc), status=403, fallback=home)
    except actions.Refused as exc:
        return answer(request, f"decision: {exc}", status=409, fallback=home)
    how = ""
    if edited is not None:  # what the journal says was done, not what the form held
        answered = Event.objects.filter(step_id=step.pk, kind=EventKind.DECISION).latest("id")
        how = EDITED if "edited" in answered.data else UNEDITED
    elif decision in ("deny", "reply") and step.judge == "model":
        decision += "_model"
    held = lease.holder(step.task) if decision == "allow" else None
    if held is not None and held.kind == "agent":
        said = SAID["allow_held"].format(
            how=how, key=step.key, holder=held, until=clock.absolute(held.until)
        )
    else:
        said = SAID[decision].format(how=how, key=step.key)
    return answer(request, said, fallback=home)


STEER: dict[str, Callable[..., Task]] = {
    "pause": actions.pause,
    "resume": actions.resume,
    "approve": actions.approve_plan,
    "decline": actions.decline_plan,
}


def _steer(request: HttpRequest, task_id: int, verb: str) -> HttpResponse:
    task = get_object_or_404(Task, pk=task_id)
    page = reverse("loop:task", args=[task.pk])
    try:
        STEER[verb](task_id=task.pk, actor=actor(request), user=request.user)
    except PermissionDenied as exc:
        return answer(request, str(exc), status=403, fallback=page)
    except actions.Refused as exc:
        return answer(request, f"state: {exc}", status=409, fallback=page)
    said = {"approve": "approved: it runs on", "decline": "declined"}.get(verb, f"{verb}d")
    return answer(request, f"Task {task.pk}: {said}.", fallback=page)


@require_POST
@login_required
def pause(request: HttpRequest, task_id: int) -> HttpResponse:
    return _steer(request, task_id, "pause")


@require_POST
@login_required
def resume(request: HttpRequest, task_id: int) -> HttpResponse:
    return _steer(request, task_id, "resume")


@require_POST
@login_required
def approve(request: HttpRequest, task_id: int) -> HttpResponse:
    return _steer(request, task_id, "approve")


@require_POST
@login_required
def decline(request: HttpRequest, task_id: int) -> HttpResponse:
    return _steer(request, task_id, "decline")
