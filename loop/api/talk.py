"""The conversation and schedules over HTTP (DESIGN.md §10): `GET/POST /api/messages`,
`GET/POST /api/schedules`. Posts are commands: an Idempotency-Key replays their answer."""

from __future__ import annotations

from django.http import HttpResponse, JsonResponse

from .. import conversation, plans, schedules
from ..models import AuthorKind, Schedule
from .core import ApiError, Call, command, reads

PAGE = 500


@reads
def list_messages(call: Call) -> HttpResponse:
    """The conversation, oldest first: the messages after `after` (a page at a time)."""
    raw = call.request.GET.get("after", "0")
    try:
        after = int(raw)
    except ValueError:
        raise ApiError(400, f"after: must be a message id (an integer), not {raw!r}") from None
    page = conversation.history(after=after)[:PAGE]
    return JsonResponse([conversation.message_dict(m) for m in page], safe=False)


@command()
def post_message(call: Call) -> HttpResponse:
    """A message by the token's agent; it ends any schedule's standing authorization."""
    text = call.body(frozenset({"text"})).get("text")
    if not isinstance(text, str):
        raise ApiError(400, "text: required, a string")
    try:
        message = conversation.post(
            author=call.agent.actor, kind=AuthorKind.AGENT, text=text, user=call.agent.user
        )
    except conversation.MessageError as exc:
        raise ApiError(400, str(exc)) from None
    return JsonResponse(conversation.message_dict(message), status=201)


@reads
def list_schedules(call: Call) -> HttpResponse:
    found = Schedule.objects.order_by("name")
    return JsonResponse([schedules.schedule_dict(s) for s in found], safe=False)


@command()
def create_schedule(call: Call) -> HttpResponse:
    """A plan with `schedule` (and `timezone`); answers the schedule."""
    spec = plans.validate(call.body())
    if spec.schedule is None:
        raise ApiError(400, "schedule: required (a cron expression); a plan without one is a task")
    schedule = schedules.create(spec=spec, actor=call.agent.actor, user=call.agent.user)
    return JsonResponse(schedules.schedule_dict(schedule), status=201)
