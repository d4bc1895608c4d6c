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
every effect in flight has its own committed claim, as a lone call's would.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.db import connections, transaction
from django.utils import timezone

from . import journal, lease, sql
from .models import Effect, EffectState, EventKind, Step
from .transitions import Conflict, move_effect, move_effects

if TYPE_CHECKING:
    from .tools import Tool

log = logging.getLogger("loop.effects")


class EffectNotSent(Exception):
    """It certainly did not leave: the effect goes back to `pending`; the step retries."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class EffectRejected(Exception):
    """The world said no, definitively: the effect and the step fail."""


class EffectUncertainError(Exception):
    """A tool may raise this to say plainly "it may have happened" (any other exception
    means the same)."""


class StepMustAsk(Exception):
    """An effect of this step is uncertain: the step blocks with "Did this happen?"."""

    def __init__(self, effects: list[Effect]) -> None:
        super().__init__(", ".join(f"{e.tool} {e.target}" for e in effects))
        self.effects = effects


class EffectBusy(Exception):
    """Another holder's claim on this effect is still live: try again after `until`."""

    def __init__(self, until: Any) -> None:
        super().__init__(f"effect busy until {until}")
        self.until = until


@dataclass
class Holder:
    """Who is calling: the worker (or agent) holding the task's lease, and its epoch."""

    owner: int
    epoch: int
    actor: str


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def effect_id(step: Step, tool_name: str, request: dict[str, Any], key: str | None = None) -> str:
    if key:
        return key if len(key) <= 64 else hashlib.sha256(key.encode()).hexdigest()
    material = f"{step.pk}\0{tool_name}\0{canonical(request)}"
    return hashlib.sha256(material.encode()).hexdigest()


@dataclass(eq=False)
class Send:
    """One side-effect call on its way through the outbox, and what became of it: the stored
    answer (`result`) or the exception its caller gets (`error`)."""

    holder: Holder
    step: Step
    tool: Tool
    args: dict[str, Any]
    key: str | None = None
    effect: Effect | None = None
    result: dict[str, Any] | None = None
    error: Exception | None = None

    @property
    def due(self) -> bool:
        """Its intent is written and it is not answered yet: to be claimed and performed."""
        return self.effect is not None and self.result is None and self.error is None

    def outcome(self) -> dict[str, Any]:
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


def call(
    holder: Holder, step: Step, tool: Tool, args: dict[str, Any], key: str | None = None
) -> dict[str, Any]:
    """Perform a side-effect tool call at most once; the stored answer on any repeat."""
    one = Send(holder, step, tool, args, key)
    send_all([one])
    return one.outcome()


def send_all(sends: list[Send]) -> None:
    """Side-effect calls of different steps, under one lease owner, through the outbox
    together: their intents in one commit (unless they were written with their steps' starts),
    their fenced claims in one commit, performed at once, their outcomes in one commit. Each
    send ends with its result or its error. A failed write raises: then nothing was performed
    that was not claimed, and nothing was claimed without a committed intent."""
    owners = {send.holder.owner for send in sends}
    assert len(owners) == 1, f"one lease owner per send_all, not {owners}"
    intend_all([send for send in sends if send.effect is None])
    claimed = _claim_all([send for send in sends if send.due])
    if claimed:
        _perform_all(claimed)


def intend_all(sends: list[Send]) -> None:
    """Look each effect up by its id: a receipt answers at once (nothing is performed); a new
    one's intent is inserted `pending`; all new intents commit together, or with the caller's
    transaction if there is one (the worker writes the intents of the calls it knows of in
    the commit that starts their steps). Then a send is `due` to be claimed, or answered."""
    if not sends:
        return
    ids = {send: effect_id(send.step, send.tool.name, send.args, send.key) for send in sends}
    marks = ", ".join("%s" for _ in sends)
    found = {e.pk: e for e in sql.load_all(Effect, f"id IN ({marks})", list(ids.values()))}
    new = []
    for send in sends:
        effect = found.get(ids[send])
        if effect is None:
            new.append(send)
            continue
        if effect.step_id == send.step.pk:
            effect.step = send.step  # spare the journal a query for it
        send.effect = effect
        try:
            send.result = _answer_from_row(send.holder, effect)
        except (EffectRejected, StepMustAsk, EffectBusy) as exc:
            send.error = exc
    if new:
        with transaction.atomic(savepoint=False), journal.batched():
            intents = sql.create_many(Effect, [_intent(send, ids[send]) for send in new])
            for send, effect in zip(new, intents, strict=True):
                effect.step = send.step
                send.effect = effect
                journal.record(
                    EventKind.EFFECT_STATE,
                    step=send.step,
                    effect=effect,
                    actor=send.holder.actor,
                    new="pending",
                )


def _intent(send: Send, eid: str) -> dict[str, Any]:
    """The row of the effect's intent, `pending`."""
    target, summary = send.tool.summary(send.args)
    return {
        "id": eid,
        "task_id": send.step.task_id,
        "step_id": send.step.pk,
        "tool": send.tool.name,
        # This call's, not only its kind's: a receiver that deduplicates makes it so too.
        "safe_to_repeat": send.tool.repeatable(send.args),
        "target": target[:500],
        "summary": summary,
        "request": send.args,
    }


def _answer_from_row(holder: Holder, effect: Effect) -> dict[str, Any] | None:
    """The stored answer, an exception for the step, or None: go on and perform it."""
    if effect.state == EffectState.SUCCEEDED:
        with transaction.atomic():
            journal.record(
                EventKind.RECEIPT_HIT, step=effect.step, effect=effect, actor=holder.actor
            )
        return dict(effect.response or {})
    if effect.state == EffectState.FAILED:
        raise EffectRejected(f"{effect.tool} {effect.target}: {effect.error} (from its receipt)")
    if effect.state == EffectState.CANCELLED:
        raise EffectRejected(f"{effect.tool} {effect.target} was cancelled by a person")
    if effect.state == EffectState.UNCERTAIN:
        raise StepMustAsk([effect])
    if effect.state == EffectState.RUNNING:
        if effect.lease_until and effect.lease_until > timezone.now():
            raise EffectBusy(effect.lease_until)
        doubt(effect, actor=holder.actor, why="its claim lapsed before the outcome was recorded")
        return _answer_from_row(holder, effect)  # now pending, uncertain, or settled meanwhile
    return None


def _claim_all(due: list[Send]) -> list[Send]:
    """Each intent to `running`, only while its task's lease is still the holder's; one
    commit. The sends claimed (the others carry why not)."""
    if not due:
        return []
    claimed, fields = [], []
    with transaction.atomic(), journal.batched():
        owner = due[0].holder.owner
        fences = lease.fenced_all(owner, [(s.step.task_id, s.holder.epoch) for s in due])
        for send in due:
            fence = fences[send.step.task_id]
            assert send.effect is not None
            if isinstance(fence, lease.LeaseLost):
                send.error = fence
                continue
            claimed.append(send)
            fields.append(
                {
                    "lease_owner": owner,
                    "lease_epoch": send.holder.epoch,
                    "lease_until": fence.lease_until,
                    "sends": send.effect.sends + 1,
                    "error": "",
                }
            )
        if _moved_together(claimed, "claim", fields, [{} for _ in claimed]):
            return claimed
        for send, sets in zip(list(claimed), fields, strict=True):
            assert send.effect is not None
            try:
                move_effect(send.effect, "claim", actor=send.holder.actor, fields=sets)
            except Conflict as exc:  # settled or claimed meanwhile: the step tries again
                send.error = exc
                claimed.remove(send)
    return claimed


def _moved_together(
    sends: list[Send], event: str, fields: list[dict[str, Any]], where: list[dict[str, Any]]
) -> bool:
    """Move the sends' effects (all in one state) in one statement; False if any one of them
    had moved meanwhile (then none did, and the caller moves them one by one)."""
    effects = [send.effect for send in sends if send.effect is not None]
    if len(effects) < 2 or len({e.state for e in effects}) > 1 or len(effects) < len(sends):
        return False
    try:
        with transaction.atomic():  # a savepoint: undone if any one of them had moved
            move_effects(effects, event, actor=sends[0].holder.actor, fields=fields, where=where)
    except Conflict:
        return False
    return True


def _perform_all(claimed: list[Send]) -> None:
    """Perform the claimed effects (at once, when there are several), then record every
    outcome in one commit; an uncertain one is probed before the step has to ask."""
    outcomes = _perform(claimed)
    doubted = []
    with transaction.atomic(), journal.batched():
        # The usual case, every effect done, in one statement; any other outcome one by one.
        done = [send for send, (_, exc) in zip(claimed, outcomes, strict=True) if exc is None]
        mine = [{"lease_owner": s.holder.owner, "lease_epoch": s.holder.epoch} for s in done]
        responses = [{"response": response} for response, exc in outcomes if exc is None]
        if _moved_together(done, "succeed", responses, mine):
            for send in done:
                assert send.effect is not None
                send.result = dict(send.effect.response or {})
            outcomes = [o for o in outcomes if o[1] is not None]
            claimed = [send for send in claimed if send.result is None]
        for send, (response, exc) in zip(claimed, outcomes, strict=True):
            if _settle_outcome(send, response, exc):
                doubted.append(send)
    for send in doubted:
        assert send.effect is not None
        if probe_and_settle(send.effect, send.tool, actor=send.holder.actor):
            send.result, send.error = dict(send.effect.response or {}), None


Outcome = tuple[dict[str, Any] | None, Exception | None]


def _perform(claimed: list[Send]) -> list[Outcome]:
    """Each tool's response, or what it raised. Several are performed at once: the tools that
    can (`Tool.start`) put their requests out one after another, then their answers are read;
    any other tool runs in a thread of its own meanwhile."""
    if len(claimed) == 1:
        return [_run(claimed[0])]
    threads = {n: _pool().submit(_run_apart, s) for n, s in enumerate(claimed) if not s.tool.start}
    outcomes: dict[int, Outcome] = {}
    answers: dict[int, Callable[[], dict[str, Any]]] = {}
    for n, send in enumerate(claimed):
        if send.tool.start is not None:
            started = _run(send, send.tool.start)
            if started[1] is not None:
                outcomes[n] = (None, started[1])
            else:
                answers[n] = started[0]  # type: ignore[assignment]
    for n, answer in answers.items():
        outcomes[n] = _run(claimed[n], _awaiting(answer))
    for n, thread in threads.items():
        outcomes[n] = thread.result()
    return [outcomes[n] for n in range(len(claimed))]


def _awaiting(answer: Callable[[], dict[str, Any]]) -> Callable[[dict[str, Any], str], Any]:
    return lambda args, effect_id: answer()


def _run(send: Send, part: Callable[[dict[str, Any], str], Any] | None = None) -> Outcome:
    """The tool (or `part` of it), performing the effect: what it returned, or raised."""
    from .tools import Call, calling

    assert send.effect is not None
    try:
        with calling(Call.of(send.step, send.holder.owner, send.holder.epoch)):
            return (part or send.tool.run)(send.args, send.effect.pk), None
    except Exception as exc:
        return None, exc


def _run_apart(send: Send) -> Outcome:
    """`_run` in a thread of the pool: any database connection the tool opened is closed."""
    try:
        return _run(send)
    finally:
        connections.close_all()


_threads: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor:
    global _threads
    if _threads is None:
        _threads = ThreadPoolExecutor(max_workers=256, thread_name_prefix="effect")
    return _threads


def _settle_outcome(send: Send, response: dict[str, Any] | None, exc: Exception | None) -> bool:
    """Inside the outcome commit: the effect's state by what the tool reported (DESIGN.md §6),
    and the send's result or error. True if the effect is now uncertain (worth a probe)."""
    from .tools import ToolError

    effect = send.effect
    assert effect is not None
    holder = send.holder
    mine = {"lease_owner": holder.owner, "lease_epoch": holder.epoch}
    if exc is None:
        _settle(effect, "succeed", holder, mine, {"response": response})
        send.result = dict(effect.response or {})
    elif isinstance(exc, EffectNotSent):
        _settle(effect, "not_sent", holder, mine, {"error": str(exc)})
        send.error = exc
    elif isinstance(exc, EffectRejected | ToolError):
        _settle(effect, "reject", holder, mine, {"error": str(exc)})
        send.error = EffectRejected(str(exc))
        send.error.__cause__ = exc
    elif effect.safe_to_repeat:
        # Performing it again is harmless (§5): no question, back to `pending` and retry.
        log.warning("effect %s %s failed, will repeat: %r", effect.tool, effect.target, exc)
        _settle(effect, "requeue", holder, mine, {"error": f"{type(exc).__name__}: {exc}"})
        send.error = EffectNotSent(f"{type(exc).__name__}: {exc} (safe to repeat)")
        send.error.__cause__ = exc
    else:  # anything else: it may have happened
        log.warning("effect %s %s uncertain: %r", effect.tool, effect.target, exc)
        fields = {"error": f"{type(exc).__name__}: {exc}", "evidence": ""}
        _settle(effect, "doubt", holder, mine, fields)
        send.error = StepMustAsk([effect])
        send.error.__cause__ = exc
        return effect.state == EffectState.UNCERTAIN
    return False


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
        from .tools import ProbeResult

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
