"""The judge seam: the verdict a judge gives, the work it is given, and the interface (see
`loop.judges`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..outcomes import Busy, Done, Fenced, NotSent, Outcome, Rejected, Uncertain

if TYPE_CHECKING:
    from ..effects import Holder, Intent, Receipt, Request
    from ..models import Step


@dataclass(frozen=True)
class Verdict:
    kind: str  # "done" | "failed" | "retry" | "blocked"
    output: Any = None
    error: str = ""
    delay: float | None = None  # retry: seconds to wait (None: the backoff decides)
    refund: bool = False  # retry: the attempt is given back (the step was not at fault)
    ask: tuple[str, str] | None = None  # blocked: the question (kind, text) to ask Dad
    # done: the successes of the step's effects, written in the commit of this verdict
    receipts: tuple[Receipt, ...] = ()

    @classmethod
    def done(cls, output: Any) -> Verdict:
        return cls("done", output=output)

    @classmethod
    def failed(cls, error: str) -> Verdict:
        return cls("failed", error=error)

    @classmethod
    def retry(cls, error: str, delay: float | None = None, refund: bool = False) -> Verdict:
        return cls("retry", error=error, delay=delay, refund=refund)

    @classmethod
    def blocked(cls, error: str, ask: tuple[str, str] | None = None) -> Verdict:
        """Ask Dad `ask`, or (without it) "Did this happen?" about the step's uncertain
        effects."""
        return cls("blocked", error=error, ask=ask)


@dataclass(frozen=True)
class Work:
    """A started step for a judge: who holds its task (at which epoch), and its side-effect
    call if `plan_call` knew it before the start (its intent written with the start)."""

    step: Step
    holder: Holder
    call: Intent | None = None


class Judge(Protocol):
    def plan_call(self, step: Step, holder: Holder) -> Request | None:
        """The side-effect call this step will make, if it is known before the step runs;
        None if the judge decides its calls while it runs (or finds the call wanting: it
        says why when the step runs)."""

    def perform(self, turn: Sequence[Work]) -> list[Verdict | Fenced]:
        """Each step's verdict, in order; `Fenced` for a step whose lease moved on (its new
        holder finishes it). Inside no transaction: each write commits on its own, except the
        `receipts` a verdict carries, which the caller writes in the commit of that verdict.
        A failed write raises (DatabaseError)."""


def verdict_of(outcome: Outcome, where: str) -> Verdict | Fenced:
    """What a side-effect call's outcome makes of the step that made it, for a judge whose
    step is that one call."""
    if isinstance(outcome, Done):
        return Verdict.done(outcome.response)
    if isinstance(outcome, NotSent):
        return Verdict.retry(f"{where}: not sent: {outcome.error}", delay=outcome.retry_after)
    if isinstance(outcome, Rejected):
        return Verdict.failed(f"{where}: {outcome.error}")
    if isinstance(outcome, Uncertain):
        return Verdict.blocked(f"{where}: may have happened: {outcome}")
    if isinstance(outcome, Busy):
        return Verdict.retry(f"{where}: effect busy until {outcome.until}")
    return outcome
