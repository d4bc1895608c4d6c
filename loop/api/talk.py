"""The conversation and schedules over HTTP (DESIGN.md §10): `GET/POST /api/messages`,
`GET/POST /api/schedules`. Posts are commands: an Idempotency-Key replays their answer."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from ninja import Query, Router

from .. import conversation, plans, schedules
from ..models import AuthorKind, Schedule
from . import schemas as s
from .core import ApiError, Bearer, Call, command
from .views import After

PAGE = 500
router = Router(auth=Bearer(), tags=["conversation"])
COMMAND = Bearer(command=True)


def caller(request: HttpRequest) -> Call:
    return request.auth  # type: ignore[attr-defined,no-any-return]


@router.get(
    "/messages",
    url_name="api_messages",
    summary="The conversation after message `after`, oldest first, up to 500",
    response=s.answers(200, list[s.Message], 400),
)
def list_messages(request: HttpRequest, query: Query[After]) -> HttpResponse:
    """The conversation, oldest first: the messages after `after` (a page at a time)."""
    page = conversation.history(after=query.after)[:PAGE]
    return JsonResponse([conversation.message_dict(m) for m in page], safe=False)


@router.post(
    "/messages",
    auth=COMMAND,
    url_name="api_messages",
    summary="Write in the conversation (ends any schedule's standing authorization)",
    response=s.answers(201, s.Message, command=True),
)
@command()
def post_message(request: HttpRequest, body: s.NewMessage) -> HttpResponse:
    """A message by the token's agent; it ends any schedule's standing authorization."""
    call = caller(request)
    try:
        message = conversation.post(
            author=call.agent.actor, kind=AuthorKind.AGENT, text=body.text, user=call.who
        )
    except conversation.MessageError as exc:
        raise ApiError(400, str(exc)) from None
    return JsonResponse(conversation.message_dict(message), status=201)


@router.get(
    "/schedules",
    url_name="api_schedules",
    summary="Every schedule with its next due time and last run",
    response=s.answers(200, list[s.Schedule]),
)
def list_schedules(request: HttpRequest) -> HttpResponse:
    found = Schedule.objects.order_by("name")
    return JsonResponse([schedules.schedule_dict(s) for s in found], safe=False)


@router.post(
    "/schedules",
    auth=COMMAND,
    url_name="api_schedules",
    summary="Create a schedule from a plan with `schedule`",
    response=s.answers(201, s.Schedule, command=True),
)
@command()
def create_schedule(request: HttpRequest, plan: s.ScheduledPlan) -> HttpResponse:
    """A plan with `schedule` (and `timezone`); answers the schedule."""
    call = caller(request)
    spec = plans.validate(call.body())  # the plan as sent: plans.validate is its validator
    if spec.schedule is None:
        raise ApiError(400, "schedule: required (a cron expression); a plan without one is a task")
    schedule = schedules.create(spec=spec, actor=call.agent.actor, user=call.who)
    return JsonResponse(schedules.schedule_dict(schedule), status=201)
