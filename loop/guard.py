"""The guard (DESIGN.md §5): may this step start now? Pure: no Django, no clock.

The runner calls `decide()` inside the start transaction with what it read, and carries out
the decision through the transitions. Every row of the §5 table is one branch here.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from .states import EFFECT


class Decision(enum.Enum):
    START = "start"
    START_AUTHORIZED = "start_authorized"  # consumes the person's one-shot authorization
    START_AUTO_CONFIRMED = "start_auto_confirmed"  # a standing authorization (§10)
    START_RESUMED_UNSENT = "start_resumed_unsent"  # LOOP_RESUME_UNSENT=always
    ASK_MAY_I = "ask_may_i"  # first run of a confirm_before step
    ASK_MAY_I_UNSENT = "ask_may_i_unsent"  # cut before anything went out
    ASK_MAY_I_AGAIN = "ask_may_i_again"  # an authorization for another call: cleared, not used
    ASK_DID_IT_HAPPEN = "ask_did_it_happen"
    AWAIT_APPROVAL = "await_approval"  # a proposal no person approved yet: the task waits
    FAIL_CAP = "fail_cap"
    WAIT = "wait"  # an effect's claim by another holder is still live

    @property
    def starts(self) -> bool:
        return self.value.startswith("start")


@dataclass(frozen=True)
class StepFacts:
    state: str  # "pending" or "running"
    side_effect: bool
    confirm_before: bool
    attempts: int
    max_attempts: int
    retry_recorded: bool  # running with a recorded `retry` verdict: no cut
    authorized: bool
    # The authorization was given for a call other than the one about to run (§5: an answer
    # is for what Dad saw).
    authorized_other_call: bool = False
    # Its call is safe to repeat (`Tool.repeatable`: a safe kind, or a receiver that
    # deduplicates by the effect id): a cut simply runs it again.
    repeatable: bool = False
    # Written by Pippa or an agent (DESIGN.md §5, "Who wrote it"): its first run needs a
    # person's answer covering its exact call, whatever `confirm_before` says; no standing
    # authorization covers it.
    unasked: bool = False
    # Proposed by Pippa or an agent and not yet approved: it never starts.
    proposed: bool = False


@dataclass(frozen=True)
class EffectFacts:
    state: str
    safe_to_repeat: bool
    lease_live: bool = False


def decide(
    step: StepFacts,
    effects: Sequence[EffectFacts],
    *,
    resume_unsent: str = "scheduled",
    standing: bool = False,
) -> Decision:
    if step.proposed:
        return Decision.AWAIT_APPROVAL
    standing = standing and not step.unasked
    # Effects of safe-to-repeat kinds never make a step uncertain or "unsent".
    guarded = [e for e in effects if not e.safe_to_repeat]
    if any(e.state == "running" and e.lease_live for e in effects):
        return Decision.WAIT
    if step.side_effect and any(e.state in ("uncertain", "running") for e in guarded):
        return Decision.ASK_DID_IT_HAPPEN  # never covered by a standing authorization
    if step.authorized and step.authorized_other_call:
        return Decision.ASK_MAY_I_AGAIN
    if step.authorized:
        # A person's "allow"/"it happened"/"do it": exactly one more start, even past the cap.
        return Decision.START_AUTHORIZED
    if step.side_effect and step.state == "pending" and step.attempts:
        if guarded and all(e.state in EFFECT.terminal for e in guarded):
            # Its question was answered by the world (a late report settled what it asked
            # about): finish from the receipts; nothing is performed again.
            return Decision.START
        # Pending again after a start only through a person's answer, since cleared: its call
        # was edited. The new call is asked about, like a first one.
        return Decision.START_AUTO_CONFIRMED if standing else Decision.ASK_MAY_I
    if step.attempts >= step.max_attempts:
        return Decision.FAIL_CAP
    if not step.side_effect:
        return Decision.START
    cut = step.state == "running" and not step.retry_recorded
    if step.attempts == 0 and not cut:
        if not step.confirm_before and not step.unasked:
            return Decision.START
        return Decision.START_AUTO_CONFIRMED if standing else Decision.ASK_MAY_I
    if not cut or step.repeatable:
        return Decision.START  # after a recorded retry the effects' states decide
    if guarded and all(e.state in EFFECT.terminal for e in guarded):
        return Decision.START  # finish from the receipts; nothing is performed again
    # Provably unsent: no guarded effect beyond `pending`.
    if resume_unsent == "always":
        return Decision.START_RESUMED_UNSENT
    return Decision.START_AUTO_CONFIRMED if standing else Decision.ASK_MAY_I_UNSENT
