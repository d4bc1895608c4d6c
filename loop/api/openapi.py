"""The OpenAPI 3.1 document served at /api/openapi.json, written by hand to match
`loop/urls.py` (a test checks every /api/ route and method is in it)."""

from __future__ import annotations

from typing import Any

JSON = "application/json"


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _id(name: str, what: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "schema": {"type": "integer", "minimum": 0},  # the URL matches digits only
        "description": what,
    }


def _answers(ok: int, schema: dict[str, Any], *errors: int) -> dict[str, Any]:
    said = {
        400: "a bad body or field, or a missing, blank or too long Idempotency-Key: `detail` names it",
        401: "no valid bearer token",
        403: "not permitted: the token's user lacks a permission the act needs (`action` and "
        "`missing` name the act and the permissions), or a lease token not this agent's",
        404: "no such task or step",
        405: "another method is expected",
        409: "refused in the current state, a lease that moved on, or an Idempotency-Key reused with another body or path",
        413: "the body is larger than DATA_UPLOAD_MAX_MEMORY_SIZE (2.5 MB by default)",
        415: "a non-empty body that is not `application/json` in UTF-8 (a form, multipart, text)",
        422: "the world said no (the effect failed definitively)",
        429: "too many wrong tokens from this address: wait `retry_after` seconds (Retry-After)",
        503: "not sent; try again (see `retry_after` and the Retry-After header)",
    }
    responses: dict[str, Any] = {
        str(ok): {"description": "OK", "content": {JSON: {"schema": schema}}}
    }
    for status in (401, 429, *errors):
        responses[str(status)] = {
            "description": said[status],
            "content": {JSON: {"schema": _ref("Error")}},
        }
    return responses


def _command(
    summary: str,
    body: dict[str, Any] | None,
    ok: int,
    schema: dict[str, Any],
    *errors: int,
    params: list[dict[str, Any]] | None = None,
    example: Any = None,
) -> dict[str, Any]:
    op: dict[str, Any] = {
        "summary": summary,
        "parameters": [*(params or []), {"$ref": "#/components/parameters/IdempotencyKey"}],
        # Any command may be refused for want of a permission (403) or for a reused
        # Idempotency-Key (409).
        "responses": _answers(ok, schema, *sorted({400, 403, 409, 413, 415, *errors})),
    }
    if body is not None:
        media: dict[str, Any] = {"schema": body}
        if example is not None:
            media["example"] = example
        op["requestBody"] = {"required": True, "content": {JSON: media}}
    return op


def _object(required: list[str], **properties: Any) -> dict[str, Any]:
    return {
        "type": "object",
        "required": required,
        "properties": properties,
        "additionalProperties": False,
    }


TASK_ID = _id("task_id", "a task id")
STEP_ID = _id("step_id", "a step id")
LEASE_TOKEN = {"type": "string", "description": "the token `next` answered"}
EMPTY = _object([])
PLAN = {
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


def document() -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Pippa Loop API",
            "version": "1",
            "description": "Agents create and steer tasks, or drive them step by step "
            "(`next` … work … `commit`). Every POST carries an `Idempotency-Key`: the same key "
            "and body again answer what the first did, and nothing is done twice. Every error "
            'is JSON, `{"detail": ...}` naming the field (also as `error`). Bodies are JSON '
            "objects in UTF-8 (else 415), at most DATA_UPLOAD_MAX_MEMORY_SIZE bytes (else 413), "
            "holding JSON values only: no NaN or Infinity, integers within ±2**63, nested at "
            "most LOOP_PLAN_MAX_DEPTH levels (else 400). The server (daphne) answers two "
            "requests itself: a header over 64 KB has its connection closed without an "
            "answer, and a multipart body it cannot parse gets a bare 400.",
        },
        "security": [{"bearer": []}],
        "paths": {
            "/api/openapi.json": {
                "get": {
                    "summary": "This document",
                    "security": [],
                    "responses": {"200": {"description": "OK"}},
                }
            },
            "/api/tasks": {
                "get": {
                    "summary": "Every task, oldest first",
                    "responses": _answers(200, {"type": "array", "items": _ref("TaskSummary")}),
                },
                "post": _command(
                    "Create a task from a plan", _ref("Plan"), 201, _ref("Task"), example=PLAN
                ),
            },
            "/api/tasks/{task_id}": {
                "get": {
                    "summary": "A task with its steps, effects and questions",
                    "parameters": [TASK_ID],
                    "responses": _answers(200, _ref("Task"), 404),
                },
            },
            "/api/tasks/{task_id}/steps": {
                "post": _command(
                    "Add steps, after the step `after` or at the end",
                    _object(
                        ["steps"],
                        steps={"type": "array", "items": _ref("PlanStep")},
                        after={"type": "string"},
                    ),
                    200,
                    _ref("Task"),
                    404,
                    409,
                    params=[TASK_ID],
                    example={"steps": [{"key": "bye", "tool": "echo", "args": {"value": "bye"}}]},
                ),
            },
            "/api/tasks/{task_id}/pause": {
                "post": _command(
                    "Pause a task", EMPTY, 200, _ref("Task"), 404, 409, params=[TASK_ID]
                )
            },
            "/api/tasks/{task_id}/resume": {
                "post": _command(
                    "Resume a paused task (a failed step that paused it is skipped)",
                    EMPTY,
                    200,
                    _ref("Task"),
                    404,
                    409,
                    params=[TASK_ID],
                )
            },
            "/api/tasks/{task_id}/supersede": {
                "post": _command(
                    "Replace the task by a successor made from a plan; answers the successor",
                    _ref("Plan"),
                    201,
                    _ref("Task"),
                    404,
                    409,
                    params=[TASK_ID],
                    example=PLAN,
                )
            },
            "/api/tasks/{task_id}/next": {
                "post": _command(
                    "Claim the task's lease (LOOP_AGENT_LEASE_SECONDS, 15 minutes) and start its first open step; `step` is null when the guard asked a question or nothing is left to run. The agent keeps the task between its commits (workers do not claim it) until it lets go or the lease runs out",
                    EMPTY,
                    200,
                    _object(
                        ["step", "task"],
                        step={"oneOf": [_ref("Step"), {"type": "null"}]},
                        lease_token={"type": "string"},
                        lease_until={"type": "string", "format": "date-time"},
                        task={"type": "object"},
                    ),
                    404,
                    409,
                    params=[TASK_ID],
                ),
            },
            "/api/tasks/{task_id}/release": {
                "post": _command(
                    "Let go of a task this agent holds, so workers may take it; 409 when the agent does not hold it",
                    EMPTY,
                    200,
                    _object(["task"], task=_ref("TaskSummary")),
                    404,
                    409,
                    params=[TASK_ID],
                ),
            },
            "/api/steps/{step_id}/commit": {
                "post": _command(
                    "Commit the verdict on the step this agent holds, fenced on its lease; a late one is journaled as late_result and refused (409). The agent keeps the task (its lease unchanged) unless `release` is true or the task finished",
                    _object(
                        ["lease_token", "verdict"],
                        lease_token=LEASE_TOKEN,
                        verdict={"enum": ["done", "failed", "retry", "blocked"]},
                        output={"description": "done: the step's output"},
                        error={"type": "string"},
                        delay={
                            "type": "number",
                            "minimum": 0,
                            "description": "retry: seconds to wait",
                        },
                        release={
                            "type": "boolean",
                            "description": "let go of the task with this commit (default false)",
                        },
                    ),
                    200,
                    _object(
                        ["step", "task", "lease_until"],
                        step=_ref("Step"),
                        task=_ref("TaskSummary"),
                        lease_until={
                            "oneOf": [{"type": "string", "format": "date-time"}, {"type": "null"}],
                            "description": "until when the agent still holds the task; null once let go",
                        },
                    ),
                    403,
                    404,
                    409,
                    params=[STEP_ID],
                    example={"lease_token": "…", "verdict": "done", "output": {"value": "hi"}},
                ),
            },
            "/api/steps/{step_id}/renew": {
                "post": _command(
                    "Extend this agent's lease on the step's task",
                    _object(["lease_token"], lease_token=LEASE_TOKEN),
                    200,
                    _object(["lease_until"], lease_until={"type": "string", "format": "date-time"}),
                    403,
                    404,
                    409,
                    params=[STEP_ID],
                ),
            },
            "/api/steps/{step_id}/unblock": {
                "post": _command(
                    "Answer a blocked step's question (needs loop.confirm_step for the token's user)",
                    _object(
                        ["decision"],
                        decision={"enum": ["allow", "deny", "happened", "rerun", "fail"]},
                        note={"type": "string"},
                    ),
                    200,
                    _ref("Step"),
                    403,
                    404,
                    409,
                    params=[STEP_ID],
                ),
            },
            "/api/effects": {
                "post": _command(
                    "Perform the side-effect call of the step this agent holds (its tool, its args resolved; another call is a 409), through the outbox: at most once, the stored answer on a repeat",
                    _object(
                        ["lease_token", "step", "tool"],
                        lease_token=LEASE_TOKEN,
                        step={"type": "integer"},
                        tool={"type": "string"},
                        args={"type": "object"},
                        key={
                            "type": "string",
                            "description": "the effect's idempotency key (default: a digest of step, tool and args)",
                        },
                    ),
                    200,
                    _object(
                        ["effect", "output"], effect={"type": "string"}, output={"type": "object"}
                    ),
                    403,
                    404,
                    409,
                    422,
                    503,
                    example={
                        "lease_token": "…",
                        "step": 2,
                        "tool": "file.write",
                        "args": {"path": "notes/hello.txt", "content": "hello"},
                    },
                ),
            },
            "/api/events": {
                "get": {
                    "summary": "The journal after event `after`, oldest first, up to 500",
                    "parameters": [
                        {
                            "name": "after",
                            "in": "query",
                            "schema": {"type": "integer", "default": 0},
                        }
                    ],
                    "responses": _answers(
                        200,
                        _object(
                            ["events", "last"],
                            events={"type": "array", "items": _ref("Event")},
                            last={"type": "integer"},
                        ),
                        400,
                    ),
                },
            },
            **CONVERSATION_PATHS,
        },
        "components": {
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "manage.py agent_token NAME --user USERNAME",
                }
            },
            "parameters": {
                "IdempotencyKey": {
                    "name": "Idempotency-Key",
                    "in": "header",
                    "required": True,
                    "schema": {"type": "string", "minLength": 1, "maxLength": 255},
                    "description": "the command id, required on every POST: missing, blank or "
                    "over 255 characters is a 400. The same key with the same body on the same "
                    "path answers the stored response again (`Idempotent-Replayed: true`); the "
                    "same key with another body, or on another path, is a 409.",
                },
            },
            "schemas": SCHEMAS,
        },
    }


def _typed(**types: str | dict[str, Any]) -> dict[str, Any]:
    """An object whose properties have these JSON types (a name, or a schema)."""
    properties = {k: {"type": v} if isinstance(v, str) else v for k, v in types.items()}
    return {"type": "object", "properties": properties}


SCHEMAS: dict[str, Any] = {
    "Error": {
        **_typed(
            detail="string",
            error={"type": "string", "description": "the same as `detail`, for older clients"},
            errors={"type": "array", "items": {"type": "string"}, "description": "a plan's"},
            action={"type": "string", "description": "403: the act refused"},
            missing={
                "type": "array",
                "items": {"type": "string"},
                "description": "403: the permissions the act needs and the user lacks",
            },
        ),
        "required": ["detail"],
    },
    "Plan": {
        **_typed(title="string", steps={"type": "array", "items": _ref("PlanStep")}),
        "required": ["title", "steps"],
    },
    "PlanStep": {
        **_typed(
            key="string",
            title="string",
            tool="string",
            args="object",
            side_effect="boolean",
            confirm_before="boolean",
            max_attempts="integer",
        ),
        "required": ["key", "tool"],
    },
    "TaskSummary": _typed(id="integer", title="string", state="string"),
    "Task": {
        "allOf": [
            _ref("TaskSummary"),
            _typed(
                created_at="string",
                successor={"type": ["integer", "null"]},
                steps={"type": "array", "items": _ref("Step")},
                events={
                    "type": "array",
                    "items": _typed(
                        id="integer",
                        kind="string",
                        step={"type": ["integer", "null"]},
                        actor="string",
                        at="string",
                        data="object",
                    ),
                },
            ),
        ]
    },
    "Step": _typed(
        id="integer",
        key="string",
        title="string",
        tool="string",
        args="object",
        state={"enum": ["pending", "running", "blocked", "done", "failed"]},
        attempts="integer",
        max_attempts="integer",
        side_effect="boolean",
        confirm_before="boolean",
        output={},
        error="string",
        question={
            "oneOf": [
                {"type": "null"},
                _typed(
                    kind={"enum": ["may_i", "did_it_happen"]},
                    text="string",
                    call={"oneOf": [{"type": "null"}, _ref("Call")]},
                    effects={"type": "array", "items": _ref("Effect")},
                ),
            ]
        },
        effects={"type": "array", "items": _ref("Effect")},
    ),
    # A call as a person is shown it: every field in full (loop/tools/shown.py).
    "Call": _typed(
        tool="string",
        target="string",
        summary="string",
        request_view={"type": "array", "items": _ref("RequestField")},
    ),
    "Effect": _typed(
        id="string",
        tool="string",
        state="string",
        target="string",
        summary="string",
        request_view={"type": "array", "items": _ref("RequestField")},
        evidence="string",
        error="string",
        response={},
        sends="integer",
    ),
    "RequestField": {
        **_typed(label="string", text="string", format={"enum": ["text", "code", "json"]}),
        "required": ["label", "text", "format"],
    },
    "Event": _typed(
        id="integer",
        kind="string",
        task={"type": ["integer", "null"]},
        step={"type": ["integer", "null"]},
        effect={"type": ["string", "null"]},
        actor="string",
        data="object",
        created_at="string",
    ),
}

SCHEMAS.update(
    {
        "Message": _typed(
            id="integer", author="string", author_kind="string", text="string", at="string"
        ),
        "ScheduledPlan": {
            **_typed(
                title="string",
                schedule="string",
                timezone="string",
                steps={"type": "array", "items": _ref("PlanStep")},
            ),
            "required": ["title", "schedule", "steps"],
        },
        "Schedule": _typed(
            id="integer",
            name="string",
            cron="string",
            timezone="string",
            enabled="boolean",
            next_due={"type": ["string", "null"]},
            last_run={"type": ["object", "null"]},
            last_error="string",
            plan="object",
        ),
    }
)

CONVERSATION_PATHS: dict[str, Any] = {
    "/api/messages": {
        "get": {
            "summary": "The conversation after message `after`, oldest first, up to 500",
            "parameters": [
                {"name": "after", "in": "query", "schema": {"type": "integer", "default": 0}}
            ],
            "responses": _answers(200, {"type": "array", "items": _ref("Message")}, 400),
        },
        "post": _command(
            "Write in the conversation (ends any schedule's standing authorization)",
            _object(["text"], text={"type": "string"}),
            201,
            _ref("Message"),
        ),
    },
    "/api/schedules": {
        "get": {
            "summary": "Every schedule with its next due time and last run",
            "responses": _answers(200, {"type": "array", "items": _ref("Schedule")}),
        },
        "post": _command(
            "Create a schedule from a plan with `schedule`",
            _ref("ScheduledPlan"),
            201,
            _ref("Schedule"),
            409,
        ),
    },
}
