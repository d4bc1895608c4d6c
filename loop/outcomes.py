"""What became of a side-effect call (DESIGN.md §6), as values.

A tool reports how its call ended by returning its response or by raising one of the three
exceptions below; the outbox (`loop.effects`) catches them the moment the tool returns,
records the effect's state, and hands its caller an `Outcome`: a plain value, never an
exception to re-raise. Judges turn outcomes into verdicts; the API turns them into answers.

This module is the floor both tools and the outbox stand on: it imports neither.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .models import Effect


# ---- what a tool raises --------------------------------------------------------------------


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


# ---- what the outbox returns ---------------------------------------------------------------


@dataclass(frozen=True)
class Done:
    """It happened: the stored response (`receipt`: answered from an earlier send's receipt,
    nothing performed now)."""

    response: dict[str, Any]
    receipt: bool = False


@dataclass(frozen=True)
class NotSent:
    """It certainly did not leave (its effect is `pending` again): retry, after `retry_after`
    seconds if the receiver said so. Nothing was cut, so nobody is asked."""

    error: str
    retry_after: float | None = None


@dataclass(frozen=True)
class Rejected:
    """The world said no, definitively (or a person cancelled it): the step fails."""

    error: str


@dataclass(frozen=True)
class Uncertain:
    """It may or may not have happened: the step asks "Did this happen?" about `effects`."""

    effects: tuple[Effect, ...]
    error: str = ""

    def __str__(self) -> str:
        return ", ".join(f"{e.tool} {e.target}" for e in self.effects)


@dataclass(frozen=True)
class Busy:
    """Another holder's claim on the effect is still live until `until`: try again then."""

    until: datetime


@dataclass(frozen=True)
class Fenced:
    """The task's lease moved on before the effect was claimed: nothing was performed, and
    this holder has no say over the step any more (its new holder finishes it)."""

    reason: str


Outcome = Done | NotSent | Rejected | Uncertain | Busy | Fenced
