"""The effect outbox (DESIGN.md §6): intent, fenced claim, receipt.

    build request -> look up the row by its deterministic id
      succeeded/failed -> the stored answer (receipt_hit), nothing performed
      uncertain        -> the step must ask "Did this happen?"
    insert `pending` -> COMMIT -> claim `running` (fenced on the task's lease) -> COMMIT
    -> perform -> `succeeded` with the response / `failed` / back to `pending` / `uncertain`
    -> COMMIT

Nothing is performed inside the transaction that recorded it, and nothing is performed
without a committed intent: a failed write raises before the world is touched.

`send_all` takes the calls of several steps (a worker's batch) through these phases together,
so each COMMIT serves them all, and performs the claimed effects at once, one thread each:
every effect in flight has its own committed claim, as a lone call's would. With `deferring`
(the worker's tool judge), a success is not committed on its own: it comes back as a
`Receipt`, which the caller writes in the commit of its step's verdict (`record_receipts`). A
cut before that commit leaves the effect `running` under a lapsing claim, which settles as
every such cut does (§9): one safe to repeat goes back to `pending` and is sent again (the
receiver deduplicating on its key), so it costs no question; one that is not asks "Did this
happen?", as a cut while it was in flight would, and the worker holds one such at a time. A
step's batch saves a commit either way.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from django.db import connections, transaction

from . import clock, installation, journal, lease, sql
from .models import Effect, EffectState, EventKind, Step
from .outcomes import (
    Busy,
    Done,
    EffectNotSent,
    EffectRejected,
    Fenced,
    NotSent,
    Outcome,
    Rejected,
    Uncertain,
)
from .tools import Call, ProbeResult, Tool, ToolError, calling
from .transitions import Conflict, move_effect, move_effects

log = logging.getLogger("loop.effects")


@dataclass
class Holder:
    """Who is calling: the worker (or agent) holding the task's lease, and its epoch."""

    owner: int
    epoch: int
    actor: str


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def call_digest(tool_name: str, args: Any) -> str:
    """A call — its tool and its canonical arguments — as a digest: what an authorization
    covers (`loop.calls`) and what makes two calls of a step the same effect."""
    return hashlib.sha256(f"{tool_name}\0{canonical(args)}".encode()).hexdigest()


def effect_id(step: Step, tool_name: str, request: dict[str, Any], again: int = 0) -> str:
    """The effect's id (DESIGN.md §6): a digest of the installation's secret, the step, the
    call and `again` (how many times a person allowed this exact call once more). The same
    call made again in its step — after a cut, in a later turn or attempt, under another
    caller's key — is the same effect; two databases never share one."""
    call = call_digest(tool_name, request)
    material = f"{installation.secret()}\0{step.pk}\0{call}\0{again}"
    return hashlib.sha256(material.encode()).hexdigest()


@dataclass(frozen=True, eq=False)
class Request:
    """One side-effect call, as its caller (a judge, an agent) asks for it: who holds the
    step's task, the step, the tool and its arguments; the caller's own idempotency key (an
    alias of the effect, bound to this request: `key_taken`), and which time a person allowed
    this exact call (`again`, 0 for the first)."""

    holder: Holder
    step: Step
    tool: Tool
    args: dict[str, Any]
    key: str | None = None
    again: int = 0
    covered: bool = False  # a person's answer covers exactly this call (its secrets are filled in)

    @cached_property
    def call(self) -> str:
        return call_digest(self.tool.name, self.args)

    @cached_property
    def effect_id(self) -> str:
        return effect_id(self.step, self.tool.name, self.args, self.again)


def latest_of_call(step: Step, tool_name: str, args: dict[str, Any]) -> Effect | None:
    """The step's latest effect of exactly this call (the highest `again`), or None: what a
    call made again in its step is answered from."""
    return (
        Effect.objects.filter(step_id=step.pk, call=call_digest(tool_name, args))
        .order_by("-again")
        .first()
    )


def key_taken(step: Step, key: str, effect_id: str) -> Effect | None:
    """The effect of this step that a caller's `key` already names for another request (the
    key is scoped to its step and bound to one request: another request under it is refused)."""
    return Effect.objects.filter(step_id=step.pk, key=key).exclude(pk=effect_id).first()


@dataclass(frozen=True, eq=False)
class Intent:
    """A request whose intent is known: its effect's row, `pending` (to be claimed and
    performed), or the outcome its row already holds (a receipt, a live claim, a doubt)."""

    request: Request
    found: Effect | Outcome


def call(
    holder: Holder, step: Step, tool: Tool, args: dict[str, Any], key: str | None = None
) -> Outcome:
    """Perform a side-effect tool call at most once; the stored answer on any repeat."""
    [outcome] = send_all([Request(holder, step, tool, args, key)])
    return outcome


@dataclass(frozen=True, eq=False)
class Receipt:
    """An effect performed and answered, safe to repeat, whose success is not yet written:
    the caller writes it (`record_receipts`) in the commit of its step's verdict."""

    request: Request
    effect: Effect
    response: dict[str, Any]


def send_all(calls: Sequence[Request | Intent]) -> list[Outcome]:
    """Side-effect calls of different steps, under one lease owner, through the outbox
    together: their intents in one commit (unless they come as intents, written with their
    steps' starts), their fenced claims in one commit, performed at once, their outcomes in
    one commit. The outcome of each, in order. A failed write raises: then nothing was
    performed that was not claimed, and nothing was claimed without a committed intent."""
    return [outcome for outcome, _ in _send_all(calls, defer=False)]


def deferring(calls: Sequence[Request | Intent]) -> list[tuple[Outcome, Receipt | None]]:
    """`send_all`, except that a success is not committed here: its `Receipt` comes with its
    outcome, for the caller to write with the step's verdict (`record_receipts`, inside that
    commit). Every other outcome is committed here.

    For an effect safe to repeat, a cut before that commit costs nothing (it is sent again).
    For one that is not, it costs one "Did this happen?" — as a cut while it was in flight
    would: the caller (the worker) holds at most one such effect unsettled at a time
    (`step_life.ASKING_AT_ONCE`) and writes its receipt in the commit that starts the next, so
    a crash still asks at most once per worker, and the step's outcome saves a commit. No
    effect is ever sent twice: its intent and its claim stay committed before it goes out."""
    return _send_all(calls, defer=True)


def _send_all(
    calls: Sequence[Request | Intent], *, defer: bool
) -> list[tuple[Outcome, Receipt | None]]:
    owners = {_request(c).holder.owner for c in calls}
    assert len(owners) <= 1, f"one lease owner per send_all, not {owners}"
    new = iter(intend_all([c for c in calls if isinstance(c, Request)]))
    intents = [c if isinstance(c, Intent) else next(new) for c in calls]
    outcomes: dict[Request, Outcome] = {
        i.request: i.found for i in intents if not isinstance(i.found, Effect)
    }
    due = [(i.request, i.found) for i in intents if isinstance(i.found, Effect)]
    claimed = _claim_all(due, outcomes)
    receipts: dict[Request, Receipt] = {}
    if claimed:
        outcomes.update(_perform_all(claimed, receipts if defer else None))
    return [(outcomes[i.request], receipts.get(i.request)) for i in intents]


def _request(call: Request | Intent) -> Request:
    return call if isinstance(call, Request) else call.request


def intend_all(requests: Sequence[Request], *, first_starts: bool = False) -> list[Intent]:
    """Look each effect up by its id: a receipt answers at once (nothing is performed); a new
    one's intent is inserted `pending`; all new intents commit together, or with the caller's
    transaction if there is one (the worker writes the intents of the calls it knows of in
    the commit that starts their steps). The intent of each request, in order.

    `first_starts`: the requests are of steps starting for the first time (`plan_calls`), so
    none of them has an effect yet (an effect's id names its step), and nothing is looked up;
    were one there after all, its insert would fail the start's commit, sending nothing."""
    if not requests:
        return []
    ids = [] if first_starts else [r.effect_id for r in requests]
    found = {e.pk: e for e in sql.by_ids(Effect, ids)} if ids else {}
    intents: dict[Request, Effect | Outcome] = {}
    new = []
    for request in requests:
        effect = found.get(request.effect_id) or _earlier(request)
        if effect is None:
            new.append(request)
            continue
        if effect.step_id == request.step.pk:
            effect.step = request.step  # spare the journal a query for it
        answer = _answer_from_row(request.holder, effect)
        intents[request] = effect if answer is None else answer
    if new:
        with transaction.atomic(savepoint=False), journal.batched():
            created = sql.create_many(Effect, [_intent(r) for r in new])
            for request, effect in zip(new, created, strict=True):
                effect.step = request.step
                intents[request] = effect
                journal.record(
                    EventKind.EFFECT_STATE,
                    step=request.step,
                    effect=effect,
                    actor=request.holder.actor,
                    new="pending",
                )
    return [Intent(r, intents[r]) for r in requests]


def _earlier(request: Request) -> Effect | None:
    """A re-entered step's effect of this call recorded under an id of another form (one an
    older version wrote): the same call in its step is the same effect, whatever its id. Only
    asked on re-entry, where an earlier attempt may have made it."""
    if request.step.attempts <= 1:
        return None
    return Effect.objects.filter(
        step_id=request.step.pk, call=request.call, again=request.again
    ).first()


def _intent(request: Request) -> dict[str, Any]:
    """The row of the effect's intent, `pending`."""
    target, summary = request.tool.summary(request.args)
    return {
        "id": request.effect_id,
        "call": request.call,
        "again": request.again,
        "key": request.key or "",
        "task_id": request.step.task_id,
        "step_id": request.step.pk,
        "tool": request.tool.name,
        # This call's, not only its kind's: a receiver that deduplicates makes it so too.
        "safe_to_repeat": request.tool.repeatable(request.args),
        "target": target[:500],
        "summary": summary,
        "request": request.args,
    }


def _answer_from_row(holder: Holder, effect: Effect) -> Outcome | None:
    """The outcome the effect's row already holds, or None: go on and perform it."""
    if effect.state == EffectState.SUCCEEDED:
        with transaction.atomic():
            journal.record(
                EventKind.RECEIPT_HIT, step=effect.step, effect=effect, actor=holder.actor
            )
        return Done(dict(effect.response or {}), receipt=True)
    if effect.state == EffectState.FAILED:
        return Rejected(f"{effect.tool} {effect.target}: {effect.error} (from its receipt)")
    if effect.state == EffectState.CANCELLED:
        return Rejected(f"{effect.tool} {effect.target} was cancelled by a person")
    if effect.state == EffectState.UNCERTAIN:
        return Uncertain((effect,))
    if effect.state == EffectState.RUNNING:
        if effect.lease_until and effect.lease_until > clock.now():  # the database's time
            return Busy(effect.lease_until)
        doubt(effect, actor=holder.actor, why="its claim lapsed before the outcome was recorded")
        return _answer_from_row(holder, effect)  # now pending, uncertain, or settled meanwhile
    return None


Claimed = tuple[Request, Effect]


def _claim_all(due: list[Claimed], refused: dict[Request, Outcome]) -> list[Claimed]:
    """Each intent to `running`, only while its task's lease is still the holder's; one
    commit. The calls claimed; each call not claimed gets its outcome in `refused`. Intents
    of one state are claimed with one statement; if any one of them had moved meanwhile, that
    transaction is rolled back whole (no savepoint: a round trip each way, every time, for a
    rare race) and they are claimed one by one in another."""
    if not due:
        return []
    if len(due) > 1 and len({effect.state for _, effect in due}) == 1:
        fenced: dict[Request, Outcome] = {}
        try:
            claimed = _claim(due, fenced, together=True)
        except Conflict:
            pass  # none of them moved (its transaction is gone): one by one, below
        else:
            refused.update(fenced)
            return claimed
    return _claim(due, refused, together=False)


def _claim(due: list[Claimed], refused: dict[Request, Outcome], *, together: bool) -> list[Claimed]:
    """`_claim_all` in one transaction: `together`, with one statement (Conflict if any one of
    them had moved), else one by one (one that moved is refused `NotSent`)."""
    claimed: list[Claimed] = []
    fields = []
    with transaction.atomic(), journal.batched():
        owner = due[0][0].holder.owner
        fences = lease.fenced_all(owner, [(r.step.task_id, r.holder.epoch) for r, _ in due])
        for request, effect in due:
            fence = fences[request.step.task_id]
            if isinstance(fence, lease.LeaseLost):
                refused[request] = Fenced(str(fence))
                continue
            claimed.append((request, effect))
            fields.append(
                {
                    "lease_owner": owner,
                    "lease_epoch": request.holder.epoch,
                    "lease_until": fence.lease_until,
                    "sends": effect.sends + 1,
                    "error": "",
                }
            )
        if together and len(claimed) > 1:
            actor = claimed[0][0].holder.actor
            effects = [effect for _, effect in claimed]
            move_effects(effects, "claim", actor=actor, fields=fields, where=[{} for _ in effects])
            return claimed
        for (request, effect), sets in zip(list(claimed), fields, strict=True):
            try:
                move_effect(effect, "claim", actor=request.holder.actor, fields=sets)
            except Conflict as exc:  # settled or claimed meanwhile: the step tries again
                refused[request] = NotSent(f"{effect.tool} {effect.target}: {exc}")
                claimed.remove((request, effect))
    return claimed


def _perform_all(
    claimed: list[Claimed], receipts: dict[Request, Receipt] | None = None
) -> dict[Request, Outcome]:
    """Perform the claimed effects (at once, when there are several), then record every
    outcome in one commit; an uncertain one is probed before the step has to ask. Given
    `receipts`, each success goes there instead, unwritten (`deferring`)."""
    replies = _perform(claimed)
    outcomes: dict[Request, Outcome] = {}
    doubted = []
    settled = []
    for (request, effect), reply in zip(claimed, replies, strict=True):
        if receipts is not None and not isinstance(reply, Exception):
            receipts[request] = Receipt(request, effect, reply)
            outcomes[request] = Done(dict(reply))
        else:
            settled.append(((request, effect), reply))
    if not settled:
        return outcomes
    with transaction.atomic(), journal.batched():
        # The usual case, every effect done, in one statement; any other outcome one by one.
        done = [(c, reply) for c, reply in settled if not isinstance(reply, Exception)]
        left = _moved_together([c for c, _ in done], [reply for _, reply in done]) if done else []
        moved = {effect.pk for (_, effect), _ in done} - {effect.pk for _, effect in left}
        for (request, effect), reply in settled:
            if effect.pk in moved:
                outcomes[request] = Done(dict(effect.response or {}))
                continue
            outcomes[request] = outcome = _settle_outcome(request, effect, reply)
            if isinstance(outcome, Uncertain) and effect.state == EffectState.UNCERTAIN:
                doubted.append((request, effect))
    for request, effect in doubted:
        if probe_and_settle(effect, request.tool, actor=request.holder.actor):
            outcomes[request] = Done(dict(effect.response or {}))
    return outcomes


def record_receipts(receipts: Sequence[Receipt]) -> None:
    """Inside the caller's transaction (the commit of the steps' verdicts): the success of
    each of these effects, as `send_all` would have written it (one statement for them all;
    one that had moved meanwhile is settled on its own, a late one journaled `late_result`)."""
    if not receipts:
        return
    claimed = [(r.request, r.effect) for r in receipts]
    with journal.batched():
        left = {effect.pk for _, effect in _moved_together(claimed, [r.response for r in receipts])}
        for receipt in receipts:
            if receipt.effect.pk in left:
                _settle_outcome(receipt.request, receipt.effect, receipt.response)


def _moved_together(claimed: list[Claimed], responses: list[dict[str, Any]]) -> list[Claimed]:
    """Inside the caller's transaction: the claimed effects (all `running`) `succeeded` with
    their responses, in one statement, each that is still this holder's claim; the others
    (moved meanwhile: a late report, a peer's doubt) are returned as they were, for the caller
    to settle one by one. No savepoint: a row that moved is simply not changed."""
    effects = [effect for _, effect in claimed]
    if len({e.state for e in effects}) > 1:
        return claimed
    mine = [{"lease_owner": r.holder.owner, "lease_epoch": r.holder.epoch} for r, _ in claimed]
    actor = claimed[0][0].holder.actor
    fields = [{"response": response} for response in responses]
    moved = move_effects(effects, "succeed", actor=actor, fields=fields, where=mine, each=True)
    done = {effect.pk for effect in moved}
    return [(r, e) for r, e in claimed if e.pk not in done]


# What a tool's run gave back: its response, or what it raised (classified at once, below).
Reply = dict[str, Any] | Exception


def _perform(claimed: list[Claimed]) -> list[Reply]:
    """Each tool's reply. Several are performed at once: the tools that can (`Tool.start`)
    put their requests out one after another, then their answers are read; any other tool
    runs in a thread of its own meanwhile."""
    if len(claimed) == 1:
        return [_run(*claimed[0])]
    threads = {
        n: _pool().submit(_run_apart, *c) for n, c in enumerate(claimed) if not c[0].tool.start
    }
    replies: dict[int, Reply] = {}
    answers: dict[int, Callable[[], dict[str, Any]]] = {}
    for n, (request, effect) in enumerate(claimed):
        if request.tool.start is not None:
            started = _run(request, effect, request.tool.start)
            if isinstance(started, Exception):
                replies[n] = started
            else:
                answers[n] = started  # type: ignore[assignment]
    for n, answer in answers.items():
        replies[n] = _run(*claimed[n], _awaiting(answer))
    for n, thread in threads.items():
        replies[n] = thread.result()
    return [replies[n] for n in range(len(claimed))]


def _awaiting(answer: Callable[[], dict[str, Any]]) -> Callable[[dict[str, Any], str], Any]:
    return lambda args, effect_id: answer()


def _run(
    request: Request, effect: Effect, part: Callable[[dict[str, Any], str], Any] | None = None
) -> Reply:
    """The tool (or `part` of it), performing the effect: what it returned, or raised."""
    try:
        holder = request.holder
        with calling(Call.of(request.step, holder.owner, holder.epoch, covered=request.covered)):
            return (part or request.tool.run)(request.args, effect.pk)  # type: ignore[no-any-return]
    except Exception as exc:
        return exc


def _run_apart(request: Request, effect: Effect) -> Reply:
    """`_run` in a thread of the pool: any database connection the tool opened is closed."""
    try:
        return _run(request, effect)
    finally:
        connections.close_all()


_threads: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor:
    global _threads
    if _threads is None:
        _threads = ThreadPoolExecutor(max_workers=256, thread_name_prefix="effect")
    return _threads


def _settle_outcome(request: Request, effect: Effect, reply: Reply) -> Outcome:
    """Inside the outcome commit: the effect's state by what the tool reported (DESIGN.md §6),
    and the call's outcome."""
    holder = request.holder
    mine = {"lease_owner": holder.owner, "lease_epoch": holder.epoch}
    if not isinstance(reply, Exception):
        _settle(effect, "succeed", holder, mine, {"response": reply})
        return Done(dict(effect.response or {}))
    if isinstance(reply, EffectNotSent):
        _settle(effect, "not_sent", holder, mine, {"error": str(reply)})
        return NotSent(str(reply), reply.retry_after)
    if isinstance(reply, EffectRejected | ToolError):
        _settle(effect, "reject", holder, mine, {"error": str(reply)})
        return Rejected(str(reply))
    error = f"{type(reply).__name__}: {reply}"
    if effect.safe_to_repeat:
        # Performing it again is harmless (§5): no question, back to `pending` and retry.
        log.warning("effect %s %s failed, will repeat: %s", effect.tool, effect.target, error)
        _settle(effect, "requeue", holder, mine, {"error": error})
        return NotSent(f"{error} (safe to repeat)")
    # Anything else: it may have happened.
    log.warning("effect %s %s uncertain: %s", effect.tool, effect.target, error)
    _settle(effect, "doubt", holder, mine, {"error": error, "evidence": ""})
    return Uncertain((effect,), error)


def _settle(
    effect: Effect, event: str, holder: Holder, mine: dict[str, Any], fields: dict[str, Any]
) -> None:
    """Inside the caller's transaction: record the outcome if the claim is still ours; a late
    report is journaled instead, and a late success settles an effect that was meanwhile
    marked uncertain (it did happen)."""
    try:
        move_effect(effect, event, actor=holder.actor, fields=fields, where=mine)
        return
    except Conflict:
        current = Effect.objects.select_for_update().get(pk=effect.pk)
        journal.record(
            EventKind.LATE_RESULT,
            step=effect.step,
            effect=current,
            actor=holder.actor,
            outcome=event,
            found=current.state,
        )
        if event == "succeed" and current.state == EffectState.UNCERTAIN:
            move_effect(
                current,
                "succeed",
                actor=holder.actor,
                fields={**fields, "evidence": f"late report from {holder.actor}"},
            )
        effect.refresh_from_db()


def doubt(effect: Effect, *, actor: str, why: str) -> None:
    """A `running` effect whose owner is gone: safe-to-repeat kinds go back to `pending`,
    all others become `uncertain`. Runs in its own transaction unless the caller has one."""
    with transaction.atomic():
        event = "requeue" if effect.safe_to_repeat else "doubt"
        try:
            move_effect(
                effect,
                event,
                actor=actor,
                fields={"error": why, "evidence": "", "lease_owner": None, "lease_until": None},
            )
        except Conflict:
            # Settled meanwhile (its late outcome, another worker's boot): nothing to doubt.
            effect.refresh_from_db()


def probe_and_settle(effect: Effect, tool: Tool, *, actor: str) -> bool:
    """Run the tool's probe for an uncertain effect. True if it found the effect happened (the
    effect is then `succeeded` with the evidence); the evidence is stored either way."""
    if tool.probe is None or effect.state != EffectState.UNCERTAIN:
        return False
    try:
        result = tool.probe(dict(effect.request), effect.pk)
    except Exception as exc:
        result = ProbeResult(None, f"probe failed: {type(exc).__name__}: {exc}")
    with transaction.atomic():
        journal.record(
            EventKind.PROBE,
            step=effect.step,
            effect=effect,
            actor=actor,
            found=result.found,
            evidence=result.evidence,
        )
        if result.found:
            move_effect(
                effect,
                "succeed",
                actor=actor,
                fields={"response": result.response or {}, "evidence": result.evidence},
            )
            return True
        Effect.objects.filter(pk=effect.pk).update(evidence=result.evidence)
        effect.evidence = result.evidence
    return False


def retire_dead(owner_ids: list[int], *, actor: str) -> int:
    """Boot reconciliation (§9): settle every `running` effect of these dead owners."""
    settled = 0
    for effect in Effect.objects.filter(lease_owner__in=owner_ids, state=EffectState.RUNNING):
        doubt(effect, actor=actor, why="server process ended before the effect completed")
        settled += 1
    return settled
