"""An outside agent drives a task itself (DESIGN.md §8, §12): `next` claims the task's lease
and starts its step exactly as a worker's tick would; the agent does the work (its side
effects through `POST /api/effects`, the outbox) and `commit`s the verdict, fenced on the
lease epoch its lease token carries. The agent keeps the task between its steps — workers do
not claim it — until it lets go (`release` on a commit, or `POST /api/tasks/{id}/release`),
its lease runs out (LOOP_AGENT_LEASE_SECONDS after `next` or `renew`), or the task finishes.

The agent's lease owner id is its token's negative pk (`AgentToken.lease_owner`), so it never
collides with a worker's, and boot reconciliation never retires it.
"""

from __future__ import annotations

import math
from typing import Any

from django.conf import settings
from django.core import signing
from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from ninja import Router

from .. import effects, journal, lease, outcomes, plans, questions, step_life, tools
from ..effects import canonical
from ..judges import Verdict
from ..models import CLAIMABLE_TASK_STATES, AgentToken, EffectState, EventKind, Step, Task
from ..permissions import require
from ..serialize import effect_dict, step_dict, task_dict, task_summary
from ..step_life import NeedsProbe, Started
from . import schemas as s
from .core import MAX_ID, ApiError, Bearer, Call, command, get_step, get_task

LEASE_SALT = "loop.api.lease"
router = Router(auth=Bearer(command=True), tags=["agent"])


def caller(request: HttpRequest) -> Call:
    return request.auth  # type: ignore[attr-defined,no-any-return]


def _holder(agent: AgentToken, epoch: int) -> effects.Holder:
    """The agent as the holder of a task's lease at `epoch`."""
    return effects.Holder(owner=agent.lease_owner, epoch=epoch, actor=agent.actor)


# ---- lease tokens ------------------------------------------------------------------------------


def lease_token(agent: AgentToken, started: Started) -> str:
    return signing.dumps(
        {
            "task": started.task_id,
            "step": started.step.pk,
            "epoch": started.epoch,
            "owner": agent.lease_owner,
        },
        salt=LEASE_SALT,
    )


def held_step(call: Call, token: str, step: Step) -> Started:
    """The start that `token` (a lease token) stands for, if it is this agent's, for `step`.
    Every use of a lease (renew, effects, commit) passes here, so here the agent's user must
    still be allowed to drive a step."""
    require(call.who, "drive a step", actor=call.agent.actor, step_id=step.pk)
    if not token:
        raise ApiError(400, "lease_token: required, the token `next` answered")
    try:
        claims = signing.loads(token, salt=LEASE_SALT)
    except signing.BadSignature:
        raise ApiError(403, "lease_token: not a lease token signed by this server") from None
    if claims.get("owner") != call.agent.lease_owner:
        raise ApiError(403, "lease_token: issued to another agent")
    if claims.get("step") != step.pk:
        raise ApiError(400, f"lease_token: is for step {claims.get('step')}, not step {step.pk}")
    if claims.get("task") != step.task_id:
        raise ApiError(403, "lease_token: not for this step's task")
    return Started(_holder(call.agent, int(claims["epoch"])), step)


def _moved_on(started: Started) -> str:
    return (
        f"lease_token: task {started.task_id} is no longer held at epoch {started.epoch} "
        "(the lease ran out or was claimed again)"
    )


# ---- next ----------------------------------------------------------------------------------------


@router.post(
    "/tasks/{int:task_id}/next",
    url_name="api_next",
    summary="Claim the task's lease (LOOP_AGENT_LEASE_SECONDS, 15 minutes) and start its first "
    "open step; `step` is null when the guard asked a question or nothing is left to run. The "
    "agent keeps the task between its commits (workers do not claim it) until it lets go or "
    "the lease runs out",
    response=s.answers(200, s.Next, 404, command=True),
)
@command(atomic=False)
def next_step(request: HttpRequest, task_id: int, body: s.Empty | None = None) -> HttpResponse:
    """Claim the task for this agent and guard and start its first open step, in one commit
    with the receipt; a step to probe first commits the claim, probes, then starts fenced."""
    call = caller(request)
    require(call.who, "drive a step", actor=call.agent.actor, task_id=task_id)
    with transaction.atomic():
        epoch = lease.claim_task(
            task_id, call.agent.lease_owner, seconds=settings.LOOP_AGENT_LEASE_SECONDS
        )
        if epoch is None:
            raise _not_claimable(task_id)
        begun = step_life.begin_one(task_id, _holder(call.agent, epoch), keeps_lease=True)
        if not isinstance(begun, NeedsProbe):
            return call.keep(_next_answer(call.agent, task_id, begun))
    return _next_answer(call.agent, task_id, step_life.probe_then_begin(begun, keeps_lease=True))


def _next_answer(agent: AgentToken, task_id: int, begun: object) -> JsonResponse:
    task = get_task(task_id)
    if not isinstance(begun, Started):
        # Nothing to run, or the guard asked a question (it is in the task's steps).
        return JsonResponse({"step": None, "task": task_dict(task)})
    return JsonResponse(
        {
            "step": step_dict(Step.objects.get(pk=begun.step.pk)),
            "lease_token": lease_token(agent, begun),
            "lease_until": task.lease_until.isoformat() if task.lease_until else None,
            "task": task_summary(task),
        }
    )


def _not_claimable(task_id: int) -> ApiError:
    task = get_task(task_id)
    if task.state not in CLAIMABLE_TASK_STATES:
        return ApiError(409, f"state: task {task_id} is {task.state}, not running")
    if task.run_after and task.run_after > timezone.now():
        return ApiError(
            409,
            f"run_after: task {task_id} waits until {task.run_after.isoformat()} (a retry)",
            retry_at=task.run_after.isoformat(),
        )
    holder = lease.holder(task)
    if holder is None:  # let go since the claim was refused
        return ApiError(409, f"lease: task {task_id} was held; ask again")
    return ApiError(
        409, f"lease: task {task_id} is held by {holder} until {holder.until.isoformat()}"
    )


# ---- commit and renew ------------------------------------------------------------------------


@router.post(
    "/steps/{int:step_id}/commit",
    url_name="api_commit",
    summary="Commit the verdict on the step this agent holds, fenced on its lease; a late one "
    "is journaled as late_result and refused (409). The agent keeps the task (its lease "
    "unchanged) unless `release` is true or the task finished",
    response=s.answers(200, s.Committed, 404, command=True),
    openapi_extra=s.example({"lease_token": "…", "verdict": "done", "output": {"value": "hi"}}),
)
@command()
def commit(request: HttpRequest, step_id: int, body: s.Commit) -> HttpResponse:
    """The agent's verdict on the step it holds, fenced on the lease: a late one is journaled
    (`late_result`) and refused. The next step is not started: the agent asks `next`."""
    call = caller(request)
    step = get_step(step_id)
    started = held_step(call, body.lease_token, step)
    verdict = _verdict(body)
    release = body.release
    if verdict.kind == "blocked" and not step.effects.filter(state=EffectState.UNCERTAIN).exists():
        # "blocked" asks Dad "Did this happen?" about the step's uncertain effects; with none,
        # there is nothing to ask (`/api/effects` answers 409 "may have happened" first).
        raise ApiError(409, f"verdict: step '{step.key}' has no uncertain effect to ask about")
    if not step_life.commit_one(started, verdict, keeps_lease=not release):
        raise ApiError(409, _moved_on(started) + "; the verdict was journaled as late_result")
    step.refresh_from_db()
    task = get_task(step.task_id)
    return JsonResponse(
        {"step": step_dict(step), "task": task_summary(task), "lease_until": _held_until(task)}
    )


def _held_until(task: Task) -> str | None:
    """Until when the task's lease is the caller's (it just committed under it), or None."""
    return (
        task.lease_until.isoformat() if task.lease_owner is not None and task.lease_until else None
    )


def _verdict(body: s.Commit) -> Verdict:
    kind, error, delay = body.verdict, body.error, body.delay
    if "output" in body.model_fields_set and kind != "done":
        raise ApiError(400, "output: only a 'done' verdict has an output")
    if delay is not None and kind != "retry":
        raise ApiError(400, "delay: only a 'retry' verdict has a delay")
    if kind == "done":
        return Verdict.done(body.output if "output" in body.model_fields_set else {})
    if kind == "retry":
        return Verdict.retry(error, delay=delay)
    return Verdict(kind, error=error)


@router.post(
    "/steps/{int:step_id}/renew",
    url_name="api_renew",
    summary="Extend this agent's lease on the step's task",
    response=s.answers(200, s.Renewed, 404, command=True),
)
@command()
def renew(request: HttpRequest, step_id: int, body: s.Renew) -> HttpResponse:
    """Extend the agent's lease on the step's task by LOOP_AGENT_LEASE_SECONDS from now."""
    call = caller(request)
    started = held_step(call, body.lease_token, get_step(step_id))
    owner = call.agent.lease_owner
    seconds = settings.LOOP_AGENT_LEASE_SECONDS
    if not lease.renew(started.task_id, owner, started.epoch, seconds=seconds):
        raise ApiError(409, _moved_on(started))
    task = get_task(started.task_id)
    return JsonResponse({"lease_until": task.lease_until.isoformat() if task.lease_until else None})


@router.post(
    "/tasks/{int:task_id}/release",
    url_name="api_release",
    summary="Let go of a task this agent holds, so workers may take it; 409 when the agent "
    "does not hold it",
    response=s.answers(200, s.Released, 404, command=True),
)
@command()
def release(request: HttpRequest, task_id: int, body: s.Empty | None = None) -> HttpResponse:
    """Let go of a task this agent holds, so workers (or other agents) may take it. A step it
    started and did not commit is left `running`: its next holder re-enters it as a cut."""
    call = caller(request)
    require(call.who, "drive a step", actor=call.agent.actor, task_id=task_id)
    task = get_task(task_id)
    if not lease.let_go(task_id, call.agent.lease_owner):
        holder = lease.holder(task)
        held = f"is held by {holder}" if holder else "is not held"
        raise ApiError(409, f"lease: task {task_id} {held}, not by {call.agent.actor}")
    journal.record(EventKind.LEASE_RELEASED, task=task_id, actor=call.agent.actor)
    return JsonResponse({"task": task_summary(get_task(task_id))})


# ---- effects -----------------------------------------------------------------------------------


@router.post(
    "/effects",
    url_name="api_effects",
    summary="Perform the side-effect call of the step this agent holds (its tool, its args "
    "resolved; another call is a 409), through the outbox: at most once, the stored answer on "
    "a repeat",
    response=s.answers(200, s.EffectDone, 404, 422, 503, command=True),
    openapi_extra=s.example(
        {
            "lease_token": "…",
            "step": 2,
            "tool": "file.write",
            "args": {"path": "notes/hello.txt", "content": "hello"},
        }
    ),
)
@command(atomic=False)
def effect(request: HttpRequest, body: s.EffectCall) -> HttpResponse:
    """A side-effect tool call for the step the agent holds, through the outbox: at most once,
    and the stored answer on any repeat (DESIGN.md §6). Its intent, claim and outcome each
    commit on their own around the call, so the command's receipt is stored after them."""
    call = caller(request)
    if body.step > MAX_ID:
        raise ApiError(404, f"step: no step {body.step}")
    step = get_step(body.step)
    started = held_step(call, body.lease_token, step)
    tool = _side_effect_tool(step, body.tool)
    args, key = body.args, body.key
    bound_to_step(call, step, tool, args)
    problems = plans.check_call(tool, args, where=f"step '{step.key}'")
    if problems:
        raise ApiError(400, "; ".join(problems))
    task = get_task(started.task_id)
    owner = call.agent.lease_owner
    if not lease.held_by(task, owner, started.epoch):
        raise ApiError(409, _moved_on(started))  # before any intent of a stale holder is written
    # The step's one call is one effect, whatever key the agent sends it under: answered from
    # its receipt on any repeat. A key names one request of its step.
    latest = effects.latest_of_call(step, tool.name, args)
    asked = effects.Request(
        started.holder, step, tool, args, key=key or None, again=latest.again if latest else 0
    )
    if key and (taken := effects.key_taken(step, key, asked.effect_id)) is not None:
        raise ApiError(
            409,
            f"key: '{key}' already names another request of step '{step.key}' "
            f"(effect {taken.pk[:12]}…); a key is bound to one request",
            effect=taken.pk,
        )
    with tools.calling(tools.Call.of(step, owner, started.epoch)):
        [outcome] = effects.send_all([asked])
    return _effect_answer(asked.effect_id, started, outcome)


def _effect_answer(eid: str, started: Started, outcome: outcomes.Outcome) -> JsonResponse:
    """What the outbox's outcome of the agent's call says to the agent."""
    if isinstance(outcome, outcomes.Rejected):
        raise ApiError(422, f"tool: {outcome.error}", effect=eid)
    if isinstance(outcome, outcomes.NotSent):
        wait = outcome.retry_after
        raise ApiError(
            503,
            f"tool: not sent, try again: {outcome.error}",
            headers={"Retry-After": str(math.ceil(wait))} if wait is not None else None,
            effect=eid,
            retry_after=wait,
        )
    if isinstance(outcome, outcomes.Uncertain):
        kind, text = questions.did_it_happen(list(outcome.effects))
        raise ApiError(
            409,
            f"effect: may have happened: {outcome}; commit the step as 'blocked' to ask",
            effect=eid,
            question={
                "kind": kind,
                "text": text,
                "effects": [effect_dict(e) for e in outcome.effects],
            },
        )
    if isinstance(outcome, outcomes.Busy):
        raise ApiError(
            409, f"effect: effect busy until {outcome.until}", effect=eid, until=str(outcome.until)
        )
    if isinstance(outcome, outcomes.Fenced):
        raise ApiError(409, _moved_on(started), effect=eid)
    return JsonResponse({"effect": eid, "output": outcome.response})


def bound_to_step(call: Call, step: Step, tool: tools.Tool, args: dict[str, Any]) -> None:
    """Only the step's own call goes out under it: its tool, its args resolved. Under an
    authorization that is the call Dad approved: a start consumes an authorization only for
    the call its digest names (`loop.calls`), and a running step's call can't change. Anything
    else is a 409 naming the difference, journaled (`call_refused`)."""
    where = f"step '{step.key}'"
    try:
        expected = plans.resolved_args(step)
    except tools.ToolError as exc:
        expected, reason = step.args, f"args: {where}: its call can't be made: {exc}"
    else:
        if tool.name != step.tool:
            reason = f"tool: {where} calls {step.tool}, not {tool.name}"
        elif canonical(args) != canonical(expected):
            reason = f"args: differ from the call of {where}"
        else:
            return
    with transaction.atomic():
        journal.record(
            EventKind.CALL_REFUSED, step=step, actor=call.agent.actor, tool=tool.name, reason=reason
        )
    raise ApiError(409, reason, call={"tool": step.tool, "args": expected})


def _side_effect_tool(step: Step, name: str) -> tools.Tool:
    if not name:
        raise ApiError(400, "tool: required, a tool name")
    tool = tools.find(name)
    if tool is None:
        raise ApiError(400, f"tool: no tool '{name}'")
    if not tool.side_effect:
        raise ApiError(400, f"tool: '{name}' has no side effects; call it yourself")
    if not step.side_effect:
        raise ApiError(
            400,
            f"step: '{step.key}' is read-only (side_effect: false); it may not call '{name}'",
        )
    reason = tool.disabled()
    if reason:
        raise ApiError(400, f"tool: '{name}' is off: {reason}")
    return tool
