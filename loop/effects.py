"""The effect outbox (DESIGN.md §6): intent, fenced claim, receipt.

    build request -> look up the row by its deterministic id
      succeeded/failed -> the stored answer (receipt_hit), nothing performed
      uncertain        -> the step must ask "Did this happen?"
    insert `pending` -> COMMIT -> claim `running` (fenced on the task's lease) -> COMMIT
    -> perform -> `succeeded` with the response / `failed` / back to `pending` / `uncertain`

Nothing is performed inside the transaction that recorded it, and nothing is performed
without a committed intent: a failed write raises before the world is touched.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.utils import timezone

from . import journal, lease, rows
from .models import Effect, EffectState, EventKind, Step
from .transitions import Conflict, move_effect

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


def call(
    holder: Holder, step: Step, tool: Tool, args: dict[str, Any], key: str | None = None
) -> dict[str, Any]:
    """Perform a side-effect tool call at most once; the stored answer on any repeat."""
    eid = effect_id(step, tool.name, args, key)
    effect = rows.load(Effect, "id = %s", [eid])
    if effect is None:
        effect = _intend(holder, step, tool, args, eid)
    elif effect.step_id == step.pk:
        effect.step = step  # spare the journal a query for it
    answer = _answer_from_row(holder, effect)
    if answer is not None:
        return answer
    _claim(holder, effect)
    return _perform(holder, effect, tool, args)


def _intend(holder: Holder, step: Step, tool: Tool, args: dict[str, Any], eid: str) -> Effect:
    target, summary = tool.summary(args)
    with transaction.atomic():
        effect = rows.create(
            Effect,
            id=eid,
            task_id=step.task_id,
            step=step,
            tool=tool.name,
            safe_to_repeat=tool.safe_to_repeat,
            target=target[:500],
            summary=summary,
            request=args,
        )
        journal.record(
            EventKind.EFFECT_STATE, step=step, effect=effect, actor=holder.actor, new="pending"
        )
    return effect


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


def _claim(holder: Holder, effect: Effect) -> None:
    with transaction.atomic():
        task = lease.fenced(effect.task_id, holder.owner, holder.epoch)
        move_effect(
            effect,
            "claim",
            actor=holder.actor,
            fields={
                "lease_owner": holder.owner,
                "lease_epoch": holder.epoch,
                "lease_until": task.lease_until,
                "sends": effect.sends + 1,
                "error": "",
            },
        )


def _perform(holder: Holder, effect: Effect, tool: Tool, args: dict[str, Any]) -> dict[str, Any]:
    from .tools import ToolError

    mine = {"lease_owner": holder.owner, "lease_epoch": holder.epoch}
    try:
        response = tool.run(args, effect.pk)
    except EffectNotSent as exc:
        _settle(effect, "not_sent", holder, mine, {"error": str(exc)})
        raise
    except (EffectRejected, ToolError) as exc:
        _settle(effect, "reject", holder, mine, {"error": str(exc)})
        raise EffectRejected(str(exc)) from exc
    except Exception as exc:  # anything else: it may have happened
        if tool.safe_to_repeat:
            # Performing it again is harmless (§5): no question, back to `pending` and retry.
            log.warning("effect %s %s failed, will repeat: %r", effect.tool, effect.target, exc)
            _settle(effect, "requeue", holder, mine, {"error": f"{type(exc).__name__}: {exc}"})
            raise EffectNotSent(f"{type(exc).__name__}: {exc} (safe to repeat)") from exc
        log.warning("effect %s %s uncertain: %r", effect.tool, effect.target, exc)
        _settle(
            effect, "doubt", holder, mine, {"error": f"{type(exc).__name__}: {exc}", "evidence": ""}
        )
        if probe_and_settle(effect, tool, actor=holder.actor):
            return dict(effect.response or {})
        raise StepMustAsk([effect]) from exc
    _settle(effect, "succeed", holder, mine, {"response": response})
    return dict(effect.response or {})


def _settle(
    effect: Effect, event: str, holder: Holder, mine: dict[str, Any], fields: dict[str, Any]
) -> None:
    """Record the outcome if the claim is still ours; a late report is journaled instead, and a
    late success settles an effect that was meanwhile marked uncertain (it did happen)."""
    with transaction.atomic():
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
