"""What every API endpoint shares: bearer-token auth, errors that name the field, and command
receipts (DESIGN.md §7, §13). django-ninja routes, parses and validates (loop/api/site.py); this
module is ours:

    Bearer()              a GET's auth: the agent's token (401, or 429 while throttled)
    Bearer(command=True)  a POST's auth: the token, then the body's size and type (413, 415), the
                          Idempotency-Key (400), and a stored answer replayed or refused (409),
                          all before ninja reads the body
    @command()            the POST's view and its receipt in one transaction

Either way `request.auth` is the `Call`: which agent asks, and for a POST its command.
A browser session never authenticates the API: only `Authorization: Bearer <token>` does.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import secrets
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import wraps
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied, RequestDataTooBig
from django.db import IntegrityError, transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from ninja.security import HttpBearer

from .. import actions, plans, throttle
from ..lease import LeaseLost
from ..models import AgentToken, Receipt, Step, Task
from ..permissions import Agent, Forbidden
from ..states import IllegalTransition
from ..transitions import Conflict

KEY_HEADER = "Idempotency-Key"
MAX_ID = 2**63 - 1  # the largest row id a database column holds (BigAutoField)
TOUCH_EVERY = timedelta(minutes=1)  # how often last_used_at is written, at most


class ApiError(Exception):
    """Answer with this status and message (which names the field); nothing was changed."""

    def __init__(
        self, status: int, message: str, *, headers: dict[str, str] | None = None, **extra: Any
    ) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers or {}
        self.extra = extra

    def response(self) -> JsonResponse:
        response = error(self.status, str(self), **self.extra)
        for name, value in self.headers.items():
            response[name] = value
        return response


def error(status: int, message: str, **extra: Any) -> JsonResponse:
    """An error answer: `detail` names the field and the problem (`error` is the same text,
    the name older clients read)."""
    return JsonResponse({"detail": message, "error": message, **extra}, status=status)


def refusal(exc: Exception) -> JsonResponse | None:
    """The 4xx answer for an exception that refuses a request, or None for any other. Each
    action that refuses has already rolled back its own writes (and kept what it journals about
    the refusal)."""
    if isinstance(exc, ApiError):
        return exc.response()
    if isinstance(exc, plans.PlanError):
        return error(400, str(exc), errors=exc.errors)
    if isinstance(exc, Forbidden):
        return error(403, str(exc), action=exc.act, missing=exc.missing)
    if isinstance(exc, PermissionDenied):
        return error(403, str(exc))
    if isinstance(exc, actions.Refused | IllegalTransition | Conflict | LeaseLost):
        return error(409, str(exc))
    return None


REFUSALS: tuple[type[Exception], ...] = (
    ApiError,
    plans.PlanError,
    Forbidden,
    PermissionDenied,
    actions.Refused,
    IllegalTransition,
    Conflict,
    LeaseLost,
)


# ---- tokens ------------------------------------------------------------------------------------


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def issue(
    *, name: str, user: User, expires_at: datetime | None = None, answers: bool = False
) -> tuple[AgentToken, str]:
    """A new token for the agent `name`, acting as `user` until `expires_at` (None: until
    revoked); `answers`: a person's own client, which may answer for them. The token is
    returned once; only its digest is stored."""
    token = secrets.token_urlsafe(32)
    agent = AgentToken.objects.create(
        name=name,
        user=user,
        digest=digest(token),
        prefix=token[:8],
        expires_at=expires_at,
        answers=answers,
    )
    return agent, token


@dataclass(eq=False)
class NoAgent(Exception):
    """Why a request has no agent: the answer it gets (401, or 429 while its address is
    throttled for wrong tokens)."""

    status: int
    message: str
    retry_after: int = 0
    expired: bool = False

    def response(self) -> JsonResponse:
        if self.status == 429:
            response = error(429, self.message, retry_after=self.retry_after)
            response["Retry-After"] = str(self.retry_after)
            return response
        response = error(401, self.message)
        challenge = 'Bearer realm="pippa-loop"'
        if self.expired:
            challenge += ', error="invalid_token", error_description="the token expired"'
        response["WWW-Authenticate"] = challenge
        return response


NEEDS_BEARER = "Authorization: a valid 'Bearer <token>' header is required"


def authenticate(request: HttpRequest) -> AgentToken | NoAgent:
    """The agent whose token the request carries. A wrong token counts against the client's
    address (loop/throttle.py); while the address is over its limit, every token is refused,
    the right one too. An expired or revoked token is the real one: it is not counted."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return NoAgent(401, NEEDS_BEARER)
    limits = throttle.token_limits(request)
    seconds = throttle.wait(limits)
    if seconds:
        return NoAgent(
            429,
            "Authorization: too many wrong tokens from this address; "
            f"try again in {throttle.in_words(seconds)}",
            retry_after=seconds,
        )
    agent = AgentToken.objects.select_related("user").filter(digest=digest(token.strip())).first()
    if agent is None:
        throttle.failed(limits)
        return NoAgent(401, NEEDS_BEARER)
    if agent.revoked or not agent.user.is_active:
        return NoAgent(401, NEEDS_BEARER)
    now = timezone.now()
    if agent.expires_at is not None and agent.expires_at <= now:
        return NoAgent(
            401,
            f"Authorization: the token of agent '{agent.name}' expired at "
            f"{agent.expires_at.isoformat()}; ask for a new one",
            expired=True,
        )
    if agent.last_used_at is None or agent.last_used_at < now - TOUCH_EVERY:
        AgentToken.objects.filter(pk=agent.pk).update(last_used_at=now)
    return agent


# ---- requests ----------------------------------------------------------------------------------


@dataclass
class Call:
    """One authenticated API request (`request.auth`): which agent asks, and for a POST its
    command."""

    request: HttpRequest
    agent: AgentToken
    command_id: str = ""
    scope: str = ""
    body_digest: str = ""
    kept: bool = field(default=False)

    @property
    def who(self) -> Agent:
        """The agent as an asker of actions (`loop.permissions.Agent`): its user's permissions,
        within an agent's rules."""
        return Agent(self.agent)

    def body(self) -> dict[str, Any]:
        """The JSON object sent, as sent (an empty body is `{}`)."""
        return parse_body(self.request)

    def keep(self, response: HttpResponse) -> HttpResponse:
        """Store `response` as this command's receipt, in the caller's transaction. A server
        error is not an answer: a retry of the command runs it again."""
        if self.kept or response.status_code >= 500:
            return response
        Receipt.objects.create(
            agent=self.agent,
            command_id=self.command_id,
            scope=self.scope,
            digest=self.body_digest,
            status=response.status_code,
            body=json.loads(response.content),
        )
        self.kept = True
        return response


def read_body(request: HttpRequest) -> bytes:
    """The request's body: 413 beyond DATA_UPLOAD_MAX_MEMORY_SIZE, 415 unless it is JSON (an
    empty body is fine with any Content-Type)."""
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    try:
        raw = request.body
    except RequestDataTooBig:
        raw = None
    if raw is None or (limit is not None and len(raw) > limit):
        raise ApiError(413, f"body: larger than {limit} bytes (DATA_UPLOAD_MAX_MEMORY_SIZE)")
    if raw.strip():
        kind = request.content_type or ""
        charset = (request.content_params or {}).get("charset", "utf-8").lower()
        if kind != "application/json":
            raise ApiError(415, f"Content-Type: send application/json, not {kind or 'nothing'!r}")
        if charset not in {"utf-8", "utf8"}:
            raise ApiError(415, f"Content-Type: the body must be UTF-8, not {charset!r}")
    return raw


def parse_body(request: HttpRequest) -> dict[str, Any]:
    """The body as a JSON object, read strictly (`plans.load_json`: finite numbers, bounded
    integers and depth); anything else is a 400 naming where."""
    raw = read_body(request)
    if not raw.strip():
        return {}
    try:
        data = plans.load_json(raw, "body")
    except plans.PlanError as exc:
        raise ApiError(400, str(exc)) from None
    if not isinstance(data, dict):
        raise ApiError(400, "body: must be a JSON object")
    return data


class Bearer(HttpBearer):
    """The agent's token (`authenticate`); for a command also its Idempotency-Key and any
    stored answer, before the body is parsed. Raises `NoAgent`, `ApiError` or `Replayed`, which
    the API answers (loop/api/site.py)."""

    openapi_description = "manage.py agent_token NAME --user USERNAME"

    def __init__(self, *, command: bool = False) -> None:
        super().__init__()
        self.command = command

    def __call__(self, request: HttpRequest) -> Call:
        agent = authenticate(request)
        if isinstance(agent, NoAgent):
            raise agent
        call = Call(request=request, agent=agent)
        if self.command:
            _prepare(call)
        return call

    def authenticate(self, request: HttpRequest, token: str) -> Any:  # pragma: no cover
        raise NotImplementedError("Bearer.__call__ authenticates")  # HttpBearer's abstract hook


class Replayed(Exception):  # noqa: N818 (an answer, not a failure)
    """A command already answered: its stored response, again."""

    def __init__(self, response: HttpResponse) -> None:
        super().__init__(response.status_code)
        self.response = response


def _prepare(call: Call) -> None:
    request = call.request
    body = read_body(request)
    key = request.headers.get(KEY_HEADER, "").strip()
    if not key:
        raise ApiError(400, f"{KEY_HEADER}: header required on every POST (a command id)")
    if len(key) > 255:
        raise ApiError(400, f"{KEY_HEADER}: at most 255 characters")
    if not key.isprintable():
        raise ApiError(400, f"{KEY_HEADER}: printable characters only")
    call.command_id = key
    call.scope = f"{request.method} {request.path}"
    call.body_digest = hashlib.sha256(body).hexdigest()
    stored = replay(call)
    if stored is not None:
        raise Replayed(stored)


View = Callable[..., HttpResponse]


def command(*, atomic: bool = True) -> Callable[[View], View]:
    """A POST's view (under `Bearer(command=True)`). With `atomic` the view runs inside one
    transaction together with its receipt; without, the view commits on its own (it performs
    something in between) and stores its receipt with `call.keep` in its last transaction, or
    else the receipt is stored after it. A refusal is an answer too: it is kept."""

    def decorate(view: View) -> View:
        @wraps(view)
        def handle(request: HttpRequest, **kwargs: Any) -> HttpResponse:
            call: Call = request.auth  # type: ignore[attr-defined]
            try:
                with transaction.atomic() if atomic else nullcontext():
                    try:
                        response = view(request, **kwargs)
                    except REFUSALS as exc:
                        response = refusal(exc) or error(400, str(exc))
                    with transaction.atomic():
                        return call.keep(response)
            except IntegrityError:
                # The same command id committed meanwhile by a concurrent request: its answer
                # stands, and what this one did was rolled back with the failed receipt.
                stored = replay(call)
                if stored is None:
                    raise
                return stored

        # ninja reads the view's parameters (its body, its path ids) from this signature; its
        # annotations are resolved where the view was written.
        handle.__signature__ = inspect.signature(view, eval_str=True)  # type: ignore[attr-defined]
        return handle

    return decorate


def replay(call: Call) -> HttpResponse | None:
    receipt = Receipt.objects.filter(agent=call.agent, command_id=call.command_id).first()
    if receipt is None:
        return None
    if receipt.scope != call.scope:
        return error(409, f"{KEY_HEADER}: already used for {receipt.scope}")
    if receipt.digest != call.body_digest:
        return error(409, f"{KEY_HEADER}: already used with another body")
    response = JsonResponse(receipt.body, status=receipt.status, safe=False)
    response["Idempotent-Replayed"] = "true"
    return response


# ---- lookups -----------------------------------------------------------------------------------


def get_task(task_id: int) -> Task:
    task = Task.objects.filter(pk=task_id).first()
    if task is None:
        raise ApiError(404, f"task: no task {task_id}")
    return task


def get_step(step_id: int) -> Step:
    step = Step.objects.filter(pk=step_id).first()
    if step is None:
        raise ApiError(404, f"step: no step {step_id}")
    return step
