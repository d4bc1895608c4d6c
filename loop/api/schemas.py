"""The API's shapes, from which django-ninja writes /api/openapi.json.

Request bodies are validated by ninja against these (strict JSON types, unknown fields
refused), except a plan's: `plans.validate` is the one validator of plans (DESIGN.md §13), so
`Plan`, `PlanStep` and `ScheduledPlan` describe a plan without checking it. Answers are built by
`loop/serialize.py` and the like and sent as they are; their schemas describe them, and
schemathesis checks that they conform (tests/test_api_schema.py).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from ninja import Schema
from pydantic import ConfigDict, Field, SkipValidation, WithJsonSchema

from .. import actions

VERDICTS = ("done", "failed", "retry", "blocked")


class Body(Schema):
    """A request body: JSON types as sent (no "1" for 1), no field it does not name."""

    model_config = ConfigDict(strict=True, extra="forbid")


# The view checks this field itself (one validator: `plans.validate` for a plan's fields).
AnyDecision = Annotated[Any, WithJsonSchema({"enum": [*actions.DECISIONS, actions.REPLY]})]


# ---- requests ----------------------------------------------------------------------------------


class PlanStep(Schema):
    """One step of a plan: documented here, checked by `plans.validate`."""

    model_config = ConfigDict(json_schema_extra={"additionalProperties": False})
    key: str
    title: str | None = None
    tool: str | None = Field(None, description="the tool judge's call; a model step has none")
    args: dict[str, Any] | None = None
    judge: Literal["tool", "model"] | None = None
    instructions: str | None = Field(None, description="what a model step is to do")
    tools: list[str] | None = Field(None, description="the tools a model step may use")
    side_effect: bool = False
    confirm_before: bool = False
    max_attempts: int | None = Field(None, ge=1)


class Plan(Schema):
    """A plan (DESIGN.md §13): documented here, passed as sent to `plans.validate`."""

    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={"required": ["title", "steps"], "additionalProperties": False},
    )
    title: SkipValidation[str] = None  # type: ignore[assignment]
    steps: SkipValidation[list[PlanStep]] = None  # type: ignore[assignment]
    judge: SkipValidation[Literal["tool", "model"]] = Field(
        None,  # type: ignore[arg-type]
        description="the judge of every step without a `tool`",
    )
    instructions: SkipValidation[str] = Field(None, description="the task's goal in words")  # type: ignore[assignment]


class NewTask(Plan):
    """A plan, or a goal in words that Pippa plans (DESIGN.md §12): `steps` or `goal`, not
    both. Passed as sent to `plans.validate`, or to `goals.plan_for` with a goal."""

    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={
            "anyOf": [{"required": ["title", "steps"]}, {"required": ["goal"]}],
            "additionalProperties": False,
        },
    )
    goal: SkipValidation[str] = Field(
        None,  # type: ignore[assignment]
        description="instead of `steps`: the goal in words; the task starts in `planning` and "
        "the model writes its plan (needs LOOP_LLM_BASE_URL); `title` is optional then",
    )


class ScheduledPlan(Plan):
    """A plan with `schedule` (cron) and its `timezone`."""

    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={
            "required": ["title", "schedule", "steps"],
            "additionalProperties": False,
        },
    )
    schedule: SkipValidation[str] = Field(None, description="a cron expression")  # type: ignore[assignment]
    timezone: SkipValidation[str] = Field(None, description="an IANA time zone, default UTC")  # type: ignore[assignment]


class Empty(Body):
    """No fields: the body may be empty, or `{}`."""


class AddSteps(Body):
    steps: SkipValidation[list[PlanStep]]  # checked by plans.validate
    after: str | None = Field(None, description="the key of the step to add them after")


class Commit(Body):
    lease_token: str = Field(description="the token `next` answered")
    verdict: Literal["done", "failed", "retry", "blocked"]
    output: Any = Field(None, description="done: the step's output")
    error: str = ""
    delay: float | None = Field(None, ge=0, description="retry: seconds to wait")
    release: bool = Field(False, description="let go of the task with this commit")


class Renew(Body):
    lease_token: str = Field(description="the token `next` answered")


class Note(Body):
    note: str = Field("", max_length=2000, description="why, in words")


class Unblock(Body):
    decision: AnyDecision  # checked by the view
    note: str = Field(
        "",
        description="what you know (`happened`: kept as the receipt); `deny`: the reason, "
        "which reaches Pippa; `reply`: your words to Pippa (required)",
    )
    args: dict[str, Any] | None = Field(
        None,
        description="with `allow`: edit, then allow — the call's arguments as you changed "
        "them, checked as the tool's; the authorization covers the edited call",
    )


class EffectCall(Body):
    lease_token: str = Field(description="the token `next` answered")
    step: int = Field(description="the id of the step the agent holds")
    tool: str
    args: dict[str, Any] = Field(default_factory=dict)
    key: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        description="your idempotency key for the call, scoped to the step and bound to one "
        "request (another request under it is a 409). The effect is the step's call whatever "
        "the key: the same call again, under any key or none, answers its receipt",
    )


class NewMessage(Body):
    text: str


# ---- answers -----------------------------------------------------------------------------------


class Error(Schema):
    detail: str = Field(description="the field and the problem")
    error: str | None = Field(None, description="the same as `detail`, for older clients")
    errors: list[str] | None = Field(None, description="a plan's problems, each naming its field")
    action: str | None = Field(None, description="403: the act refused")
    missing: list[str] | None = Field(
        None, description="403: the permissions the act needs and the user lacks"
    )
    retry_after: float | None = Field(None, description="429, 503: seconds to wait")


class RequestField(Schema):
    label: str
    text: str
    format: Literal["text", "code", "json"]


class Call(Schema):
    """A call as a person is shown it: every field in full (loop/tools/shown.py)."""

    tool: str | None = None
    target: str | None = None
    summary: str | None = None
    request_view: list[RequestField] | None = None


class Effect(Schema):
    id: str | None = None
    tool: str | None = None
    state: str | None = None
    target: str | None = None
    summary: str | None = None
    request_view: list[RequestField] | None = None
    evidence: str | None = None
    error: str | None = None
    response: Any = None
    sends: int | None = None


class Question(Schema):
    kind: Literal["may_i", "did_it_happen"] | None = None
    text: str | None = None
    call: Call | None = None
    effects: list[Effect] | None = None


class Step(Schema):
    id: int | None = None
    key: str | None = None
    title: str | None = None
    tool: str | None = None
    args: dict[str, Any] | None = None
    state: Literal["pending", "running", "blocked", "done", "failed"] | None = None
    attempts: int | None = None
    max_attempts: int | None = None
    side_effect: bool | None = None
    confirm_before: bool | None = None
    output: Any = None
    error: str | None = None
    question: Question | None = None
    effects: list[Effect] | None = None


class TaskSummary(Schema):
    id: int | None = None
    title: str | None = None
    state: str | None = None


class TaskEvent(Schema):
    id: int | None = None
    kind: str | None = None
    step: int | None = None
    actor: str | None = None
    at: str | None = None
    data: dict[str, Any] | None = None


class Task(TaskSummary):
    created_at: str | None = None
    successor: int | None = None
    steps: list[Step] | None = None
    origin: dict[str, Any] | None = None
    events: list[TaskEvent] | None = None


class Next(Schema):
    step: Step | None = Field(description="null: the guard asked a question, or nothing is left")
    lease_token: str | None = None
    lease_until: str | None = Field(None, json_schema_extra={"format": "date-time"})
    task: dict[str, Any]


class Committed(Schema):
    step: Step
    task: TaskSummary
    lease_until: str | None = Field(
        description="until when the agent still holds the task; null once let go"
    )


class Renewed(Schema):
    lease_until: str | None


class Released(Schema):
    task: TaskSummary


class EffectDone(Schema):
    effect: str
    output: Any


class Event(Schema):
    id: int | None = None
    kind: str | None = None
    task: int | None = None
    step: int | None = None
    effect: str | None = None
    actor: str | None = None
    data: dict[str, Any] | None = None
    created_at: str | None = None


class Events(Schema):
    events: list[Event]
    last: int


class Message(Schema):
    id: int | None = None
    author: str | None = None
    author_kind: str | None = None
    text: str | None = None
    at: str | None = None
    proposal: int | None = Field(None, description="the task Pippa proposed with it")
    proposed_schedule: dict[str, Any] | None = Field(
        None, description="the schedule (a plan with `schedule`) Pippa proposed with it"
    )
    answer: str | None = Field(None, description="who approved or declined that schedule")


class Schedule(Schema):
    id: int | None = None
    name: str | None = None
    cron: str | None = None
    timezone: str | None = None
    enabled: bool | None = None
    next_due: str | None = None
    last_run: dict[str, Any] | None = None
    last_error: str | None = None
    plan: dict[str, Any] | None = None


def answers(ok: int, schema: Any, *errors: int, command: bool = False) -> dict[int, Any]:
    """An operation's `response=`: its answer, and `Error` for each other status it may give.
    Any request may lack a token (401) or be throttled (429); any command may be refused for a
    bad body or key (400), want of a permission (403), a reused key (409), a body too large
    (413) or not JSON (415)."""
    statuses = {401, 429, *errors} | ({400, 403, 409, 413, 415} if command else set())
    return {ok: schema, **dict.fromkeys(sorted(statuses), Error)}


PLAN_EXAMPLE = {
    "title": "Say hello",
    "steps": [
        {"key": "greet", "tool": "echo", "args": {"value": "hello"}},
        {
            "key": "note",
            "tool": "file.write",
            "args": {"path": "notes/hello.txt", "content": "${greet.value}"},
            "confirm_before": True,
        },
    ],
}


def example(body: dict[str, Any]) -> dict[str, Any]:
    """An operation's `openapi_extra=`: a request body that works (schemathesis sends it)."""
    return {"requestBody": {"content": {"application/json": {"example": body}}}}
