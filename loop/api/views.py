"""Tasks, plans, answers and the journal over HTTP (DESIGN.md §13). Each command calls an
action in `loop/actions.py` as the token's user, whose permissions the action checks; none
writes a state field itself."""

from __future__ import annotations

from typing import Annotated, Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from ninja import Query, Router
from ninja import Schema as Params
from pydantic import BeforeValidator, Field
from pydantic_core import PydanticCustomError

from .. import actions, numbers, plans, task_search
from ..models import Event, Origin, TaskState
from ..serialize import step_dict, task_dict, task_summary
from . import schemas as s
from .core import MAX_ID, ApiError, Bearer, Call, command, get_step, get_task

EVENTS_PAGE = 500
router = Router(auth=Bearer(), tags=["tasks"])
COMMAND = Bearer(command=True)


def caller(request: HttpRequest) -> Call:
    return request.auth  # type: ignore[attr-defined,no-any-return]


def _ascii_whole(value: Any) -> Any:
    """A query string's number as `loop.numbers` reads one (ASCII digits, an optional '-'):
    pydantic's own int parsing also takes ' 12', '+12', '1_000' and '12.0'."""
    if not isinstance(value, str):
        return value
    try:
        return numbers.whole(value, "value")
    except numbers.NotANumber:
        raise PydanticCustomError("int_parsing", "not a whole number") from None


class After(Params):
    after: Annotated[int, BeforeValidator(_ascii_whole)] = Field(
        0, ge=-MAX_ID, le=MAX_ID, description="an id; the ones after it"
    )


class TaskFilters(Params):
    q: str = Field("", description="words in a task's title, its steps' titles or outputs")
    state: str = Field("", description="a task state: " + ", ".join(TaskState.values))
    origin: str = Field("", description="where it came from: " + ", ".join(task_search.ORIGINS))
    schedule: str = Field("", description="a schedule's id: its runs' tasks")
    since: str = Field("", description="created on or after this day, YYYY-MM-DD")
    until: str = Field("", description="created on or before this day, YYYY-MM-DD")
    page: str = Field("", description=f"the page, {task_search.PAGE_SIZE} tasks each")


def _found(request: HttpRequest) -> task_search.Found:
    try:
        return task_search.search(task_search.parse(request.GET))
    except task_search.FilterError as exc:
        raise ApiError(400, str(exc)) from None


@router.get(
    "/tasks",
    url_name="api_tasks",
    summary="Tasks, newest first, filtered and paginated (headers X-Total-Count and "
    "X-Page-Count); a bad filter is a 400 naming it",
    response=s.answers(200, list[s.TaskSummary], 400),
)
def list_tasks(request: HttpRequest, filters: Query[TaskFilters]) -> HttpResponse:
    found = _found(request)
    response = JsonResponse([task_summary(t) for t in found.tasks], safe=False)
    response["X-Total-Count"] = str(found.total)
    response["X-Page-Count"] = str(found.pages)
    return response


@router.get(
    "/tasks/counts",
    url_name="api_task_counts",
    summary="How many tasks are in each state, under the same filters as GET /api/tasks",
    response=s.answers(200, dict[str, int], 400),
)
def count_tasks(request: HttpRequest, filters: Query[TaskFilters]) -> HttpResponse:
    return JsonResponse(_found(request).counts)


@router.get(
    "/tasks/{int:task_id}",
    url_name="api_task",
    summary="A task with its steps, effects and questions",
    response=s.answers(200, s.Task, 404),
)
def show_task(request: HttpRequest, task_id: int) -> HttpResponse:
    return JsonResponse(task_dict(get_task(task_id)))


@router.post(
    "/tasks",
    auth=COMMAND,
    url_name="api_tasks",
    summary="Create a task from a plan, or from a goal in words that Pippa plans (`goal` "
    "instead of `steps`: the task starts in `planning`)",
    openapi_extra=s.example(s.PLAN_EXAMPLE),
    response=s.answers(201, s.Task, command=True),
)
@command()
def create_task(request: HttpRequest, plan: s.NewTask) -> HttpResponse:
    call = caller(request)
    body = call.body()
    actor, user = call.agent.actor, call.who
    if "goal" in body:
        other = sorted(set(body) - {"goal", "title"})
        if other:
            raise ApiError(400, f"{other[0]}: a task from a goal takes only 'goal' and 'title'")
        task = actions.create_task_from_goal(
            goal=body["goal"], title=body.get("title"), actor=actor, user=user, origin=Origin.API
        )
        return JsonResponse(task_dict(task), status=201)
    if "steps" not in body:
        raise ApiError(400, "steps: required, or 'goal': the task's goal in words")
    spec = plans.validate(body)  # the plan as sent: plans.validate is its validator
    if spec.schedule is not None:
        raise ApiError(400, "schedule: a plan with a schedule goes to POST /api/schedules")
    task = actions.create_task(plan=spec, actor=actor, user=user, origin=Origin.API)
    return JsonResponse(task_dict(task), status=201)


@router.post(
    "/tasks/{int:task_id}/steps",
    auth=COMMAND,
    url_name="api_add_steps",
    summary="Add steps, after the step `after` or at the end",
    openapi_extra=s.example({"steps": [{"key": "bye", "tool": "echo", "args": {"value": "bye"}}]}),
    response=s.answers(200, s.Task, 404, command=True),
)
@command()
def add_steps(request: HttpRequest, task_id: int, body: s.AddSteps) -> HttpResponse:
    call = caller(request)
    get_task(task_id)
    actions.add_steps(
        task_id=task_id,
        steps=body.steps,
        after=body.after,
        actor=call.agent.actor,
        user=call.who,
    )
    return JsonResponse(task_dict(get_task(task_id)))


@router.post(
    "/tasks/{int:task_id}/pause",
    auth=COMMAND,
    url_name="api_pause",
    summary="Pause a task",
    response=s.answers(200, s.Task, 404, command=True),
)
@command()
def pause(request: HttpRequest, task_id: int, body: s.Empty | None = None) -> HttpResponse:
    call = caller(request)
    get_task(task_id)
    paused = actions.pause(task_id=task_id, actor=call.agent.actor, user=call.who)
    return JsonResponse(task_dict(paused))


@router.post(
    "/tasks/{int:task_id}/resume",
    auth=COMMAND,
    url_name="api_resume",
    summary="Resume a paused task (a failed step that paused it is skipped)",
    response=s.answers(200, s.Task, 404, command=True),
)
@command()
def resume(request: HttpRequest, task_id: int, body: s.Empty | None = None) -> HttpResponse:
    call = caller(request)
    get_task(task_id)
    resumed = actions.resume(task_id=task_id, actor=call.agent.actor, user=call.who)
    return JsonResponse(task_dict(resumed))


@router.post(
    "/tasks/{int:task_id}/approve",
    auth=COMMAND,
    url_name="api_approve",
    summary="Approve what Pippa or an agent proposed for the task (LOOP_CONFIRM_PLANS): its "
    "steps, each side-effect call authorized as shown; the task runs on. Only a person: a "
    "token made with `agent_token --answers`; any other agent token gets 403. 409 unless the "
    "task waits for an approval",
    response=s.answers(200, s.Task, 404, command=True),
)
@command()
def approve(request: HttpRequest, task_id: int, body: s.Empty | None = None) -> HttpResponse:
    call = caller(request)
    get_task(task_id)
    approved = actions.approve_plan(task_id=task_id, actor=call.agent.actor, user=call.who)
    return JsonResponse(task_dict(approved))


@router.post(
    "/tasks/{int:task_id}/decline",
    auth=COMMAND,
    url_name="api_decline",
    summary="Decline what Pippa or an agent proposed for the task: its steps fail (waived); a "
    "goal's plan declined fails its task. Only a person (an `--answers` token); 409 unless "
    "the task waits for an approval",
    response=s.answers(200, s.Task, 404, command=True),
)
@command()
def decline(request: HttpRequest, task_id: int, body: s.Note | None = None) -> HttpResponse:
    call = caller(request)
    get_task(task_id)
    declined = actions.decline_plan(
        task_id=task_id, actor=call.agent.actor, user=call.who, note=body.note if body else ""
    )
    return JsonResponse(task_dict(declined))


@router.post(
    "/tasks/{int:task_id}/supersede",
    auth=COMMAND,
    url_name="api_supersede",
    summary="Replace the task by a successor made from a plan; answers the successor",
    openapi_extra=s.example(s.PLAN_EXAMPLE),
    response=s.answers(201, s.Task, 404, command=True),
)
@command()
def supersede(request: HttpRequest, task_id: int, plan: s.Plan) -> HttpResponse:
    call = caller(request)
    spec = plans.validate(call.body())
    get_task(task_id)
    successor = actions.supersede(
        task_id=task_id, plan=spec, actor=call.agent.actor, user=call.who, origin=Origin.API
    )
    return JsonResponse(task_dict(successor), status=201)


@router.post(
    "/steps/{int:step_id}/unblock",
    auth=COMMAND,
    url_name="api_unblock",
    summary="Answer a blocked step's question (needs loop.confirm_step for the token's user)",
    response=s.answers(200, s.Step, 404, command=True),
)
@command()
def unblock(request: HttpRequest, step_id: int, body: s.Unblock) -> HttpResponse:
    call = caller(request)
    decision = body.decision
    known = [*actions.DECISIONS, actions.REPLY]
    if not isinstance(decision, str) or decision not in known:
        raise ApiError(400, f"decision: required, one of {', '.join(known)}")
    get_step(step_id)
    step = actions.unblock(
        step_id=step_id,
        decision=decision,
        actor=call.agent.actor,
        user=call.who,
        note=body.note,
        args=body.args,
    )
    step.refresh_from_db()
    return JsonResponse(step_dict(step))


@router.post(
    "/steps/{int:step_id}/retry",
    auth=COMMAND,
    url_name="api_retry",
    summary="Run a failed step again: a replacement with a fresh attempt cap, under its key "
    "(a person's token only); the replacement",
    response=s.answers(200, s.Step, 404, command=True),
)
@command()
def retry(request: HttpRequest, step_id: int, body: s.Empty | None = None) -> HttpResponse:
    return _recover(request, step_id, actions.retry_step)


def _recover(request: HttpRequest, step_id: int, act: Any) -> HttpResponse:
    call = caller(request)
    get_step(step_id)
    step = act(step_id=step_id, actor=call.agent.actor, user=call.who)
    step.refresh_from_db()
    return JsonResponse(step_dict(step))


@router.post(
    "/steps/{int:step_id}/skip",
    auth=COMMAND,
    url_name="api_skip",
    summary="Skip a failed step: the task runs on without its output (the steps that use it "
    "fail then)",
    response=s.answers(200, s.Step, 404, command=True),
)
@command()
def skip(request: HttpRequest, step_id: int, body: s.Empty | None = None) -> HttpResponse:
    return _recover(request, step_id, actions.skip_step)


@router.get(
    "/events",
    url_name="api_events",
    summary="The journal after event `after`, oldest first, up to 500",
    response=s.answers(200, s.Events, 400),
)
def events(request: HttpRequest, query: Query[After]) -> HttpResponse:
    """The journal after event `after`, oldest first, a page at a time; `last` is the id to
    ask after next."""
    after = query.after
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
