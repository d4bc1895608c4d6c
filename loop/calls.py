"""A step's call — its tool and its arguments as resolved, which is what "May I do this?"
shows — and the digest of it that an authorization holds (DESIGN.md §5, "An answer is for what
Dad saw"; §15 invariant 6).

A start consumes an authorization only for the call its digest names; an edit that changes
the call clears it; and the call of a step with an effect beyond `pending` can't change at all.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Q

from . import journal, questions, transcript
from .effects import call_digest as digest
from .effects import canonical
from .models import Effect, EffectState, EventKind, Step

CALL_FIELDS = ("tool", "args")


def of(step: Step) -> str:
    """The digest of the call the step makes now: its args filled from earlier outputs, as
    the question shows them (as written, while a reference can't be filled: then the judge
    fails the step, and nothing is sent). A model step's: the side-effect call it waits on."""
    if step.judge == "model":
        return digest(*transcript.pending_call(step))
    return digest(step.tool, questions.asked_args(step))


def changes_call(step: Step, fields: dict[str, Any]) -> bool:
    """Whether these new field values change the step's call (its tool or its args)."""
    tool = fields.get("tool", step.tool)
    args = fields.get("args", step.args)
    return tool != step.tool or canonical(args) != canonical(step.args)


def why_fixed(step: Step) -> str:
    """Why the step's call can't change ("" if it can): it has an effect that went beyond a
    first intent — sent, answered from a receipt, uncertain, or settled by a person (one put
    back to `pending` by "It did not — do it" was claimed before) — whose request it was."""
    effect = (
        Effect.objects.filter(step_id=step.pk)
        .filter(~Q(state=EffectState.PENDING) | Q(sends__gt=0))
        .order_by("created_at", "id")
        .first()
    )
    if effect is None:
        return ""
    state = str(effect.state)
    if effect.state == EffectState.PENDING:
        state = "pending again after a person said it did not happen; it was sent before"
    return (
        f"step '{step.key}': its call can't change: effect {effect.pk[:8]}… ({effect.tool}) "
        f"is {state}; a different request is a new step"
    )


def journal_cleared(step: Step, *, actor: str, why: str) -> None:
    """Journal that the step's authorization (as read: `step.authorized_by`) was cleared, in
    the caller's transaction, which clears it."""
    journal.record(
        EventKind.AUTHORIZATION_CLEARED,
        step=step,
        actor=actor,
        by=step.authorized_by,
        call=step.authorized_call,
        why=why,
    )
