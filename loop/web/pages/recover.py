"""Retry and Skip on a failed step (`actions.retry_step`, `actions.skip_step`)."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404
from django.urls import reverse
from django.views.decorators.http import require_POST

from ... import actions
from ...models import Step
from .respond import actor, answer


def _recover(request: HttpRequest, step_id: int, *, retry: bool) -> HttpResponse:
    step = get_object_or_404(Step, pk=step_id)
    back = reverse("loop:task", args=[step.task_id])
    act = actions.retry_step if retry else actions.skip_step
    try:
        act(step_id=step.pk, actor=actor(request), user=request.user)
    except PermissionDenied as exc:
        return answer(request, str(exc), status=403, fallback=back)
    except actions.Refused as exc:
        return answer(request, f"step: {exc}", status=409, fallback=back)
    name = step.title or step.key
    said = (
        f"Trying '{name}' again, with {step.max_attempts} fresh attempts."
        if retry
        else f"Skipped '{name}': the task goes on without it."
    )
    return answer(request, said, fallback=back)


@require_POST
@login_required
def retry(request: HttpRequest, step_id: int) -> HttpResponse:
    return _recover(request, step_id, retry=True)


@require_POST
@login_required
def skip(request: HttpRequest, step_id: int) -> HttpResponse:
    return _recover(request, step_id, retry=False)
