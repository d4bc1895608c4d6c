"""Tasks, plans, answers and the journal over HTTP (DESIGN.md §13). Each command calls an
action in `loop/actions.py` as the token's user, whose permissions the action checks; none
writes a state field itself."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse

from .. import actions, plans
from ..models import Event, Origin, Task
from ..serialize import step_dict, task_dict, task_summary
from .core import ApiError, Call, command, get_step, get_task, reads
from .openapi import document

EVENTS_PAGE = 500


@reads
def list_tasks(call: Call) -> HttpResponse:
    return JsonResponse([task_summary(t) for t in Task.objects.order_by("id")], safe=False)


@reads
def show_task(call: Call, task_id: int) -> HttpResponse:
    return JsonResponse(task_dict(get_task(task_id)))


@command()
def create_task(call: Call) -> HttpResponse:
    plan = plans.validate(call.body())
    if plan.schedule is not None:
        raise ApiError(400, "schedule: a plan with a schedule goes to POST /api/schedules")
    task = actions.create_task(
        plan=plan, actor=call.agent.actor, user=call.agent.user, origin=Origin.API
    )
    return JsonResponse(task_dict(task), status=201)


@command()
def add_steps(call: Call, task_id: int) -> HttpResponse:
    data = call.body(frozenset({"steps", "after"}))
    after = data.get("after")
    if after is not None and not isinstance(after, str):
        raise ApiError(400, "after: must be a step key")
    get_task(task_id)
    actions.add_steps(
        task_id=task_id,
        steps=data.get("steps"),
        after=after,
        actor=call.agent.actor,
        user=call.agent.user,
    )
    return JsonResponse(task_dict(get_task(task_id)))


@command()
def pause(call: Call, task_id: int) -> HttpResponse:
    call.body(frozenset())
    get_task(task_id)
    paused = actions.pause(task_id=task_id, actor=call.agent.actor, user=call.agent.user)
    return JsonResponse(task_dict(paused))


@command()
def resume(call: Call, task_id: int) -> HttpResponse:
    call.body(frozenset())
    get_task(task_id)
    resumed = actions.resume(task_id=task_id, actor=call.agent.actor, user=call.agent.user)
    return JsonResponse(task_dict(resumed))


@command()
def supersede(call: Call, task_id: int) -> HttpResponse:
    plan = plans.validate(call.body())
    get_task(task_id)
    successor = actions.supersede(
        task_id=task_id, plan=plan, actor=call.agent.actor, user=call.agent.user, origin=Origin.API
    )
    return JsonResponse(task_dict(successor), status=201)


@command()
def unblock(call: Call, step_id: int) -> HttpResponse:
    """Answer a blocked step's question."""
    data = call.body(frozenset({"decision", "note"}))
    decision = data.get("decision")
    if not isinstance(decision, str) or decision not in actions.DECISIONS:
        raise ApiError(400, f"decision: required, one of {', '.join(actions.DECISIONS)}")
    note = data.get("note", "")
    if not isinstance(note, str):
        raise ApiError(400, "note: must be a string")
    get_step(step_id)
    step = actions.unblock(
        step_id=step_id, decision=decision, actor=call.agent.actor, user=call.agent.user, note=note
    )
    step.refresh_from_db()
    return JsonResponse(step_dict(step))


@reads
def events(call: Call) -> HttpResponse:
    """The journal after event `after`, oldest first, a page at a time; `last` is the id to
    ask after next."""
    raw = call.request.GET.get("after", "0")
    try:
        after = int(raw)
    except ValueError:
        raise ApiError(400, f"after: must be an event id (an integer), not {raw!r}") from None
    page = list(Event.objects.filter(id__gt=after).order_by("id")[:EVENTS_PAGE])
    return JsonResponse(
        {
            "events": [
                {
                    "id": e.pk,
                    "kind": e.kind,
                    "task": e.task_id,
                    "step": e.step_id,
                    "effect": e.effect_id,
                    "actor": e.actor,
                    "data": e.data,
                    "created_at": e.created_at.isoformat(),
                }
                for e in page
            ],
            "last": page[-1].pk if page else after,
        }
    )


def openapi(request: HttpRequest) -> HttpResponse:
    """The API's description; public, like any documentation."""
    return JsonResponse(document())
