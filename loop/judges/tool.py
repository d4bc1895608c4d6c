"""The tool judge (default, no network of its own): run the step's tool with its args, the
args' `${key.path}` references filled from earlier steps' outputs.

It judges a worker's turn of steps at once: read-only tools run in turn, and the side-effect
calls go through the outbox together (`effects.deferring`), sharing its commits; the success
of a call is written with its step's verdict (the verdict's `receipts`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from typing import TypeVar

from django.db import DatabaseError

from .. import effects, plans, tools
from ..models import Step
from ..outcomes import EffectNotSent, EffectRejected, Fenced, Outcome
from .base import Verdict, Work, verdict_of

log = logging.getLogger("loop.judge")
T = TypeVar("T")


class ToolJudge:
    """Runs each step's one call: a read-only tool in turn, the side-effect calls of a turn
    through the outbox together. A side-effect step's call is its plan's, so it is known
    before the step runs (`plan_call`)."""

    def plan_call(self, step: Step, holder: effects.Holder) -> effects.Request | None:
        if not step.side_effect:
            return None
        tool = tools.find(step.tool)
        if tool is None or not tool.side_effect:
            return None
        try:
            call = _prepare(step, holder)
        except DatabaseError:
            raise  # a failed write or read fails the transaction it is in, visibly
        except Exception:  # the judge meets it again when the step runs, and says so
            return None
        return call if isinstance(call, effects.Request) else None

    def perform(self, turn: Sequence[Work]) -> list[Verdict | Fenced]:
        prepared: list[Verdict | effects.Request | effects.Intent] = []
        for work in turn:
            if work.call is not None:
                prepared.append(work.call)
                continue
            with tools.calling(tools.Call.of(work.step, work.holder.owner, work.holder.epoch)):
                prepared.append(_judged(work.step, partial(_prepare, work.step, work.holder)))
        sends = [p for p in prepared if not isinstance(p, Verdict)]
        outcomes = iter(effects.deferring(sends))
        return [
            p if isinstance(p, Verdict) else _verdict(*next(outcomes), work.step)
            for p, work in zip(prepared, turn, strict=True)
        ]


JUDGE = ToolJudge()


def _verdict(outcome: Outcome, receipt: effects.Receipt | None, step: Step) -> Verdict | Fenced:
    """The step's verdict by its call's outcome, carrying the call's receipt if it is not
    yet written (a success is always a `done` verdict)."""
    verdict = verdict_of(outcome, _where(step))
    if receipt is None:
        return verdict
    assert isinstance(verdict, Verdict) and verdict.kind == "done", verdict
    return replace(verdict, receipts=(receipt,))


def _where(step: Step) -> str:
    return f"step '{step.key}'"


def _prepare(step: Step, holder: effects.Holder) -> Verdict | effects.Request:
    """A read-only call runs now; a side-effect call is handed back, to go to the outbox."""
    where = _where(step)
    tool = tools.get(step.tool)
    args = plans.resolved_args(step)
    problems = plans.check_call(tool, args, where=where)
    if problems:
        return Verdict.failed("; ".join(problems))
    if not tool.side_effect:
        return Verdict.done(tool.run(args))
    if not step.side_effect:
        return Verdict.failed(
            f"{where} is read-only, but tool '{tool.name}' has side effects: nothing was sent"
        )
    return effects.Request(holder, step, tool, args)


def _judged(step: Step, judge: Callable[[], T]) -> T | Verdict:
    """What `judge` returns, or the verdict its exception means (a read-only tool's: a
    side-effect call's outcome is the outbox's to tell)."""
    where = _where(step)
    try:
        return judge()
    except DatabaseError:
        raise  # the worker's business: a write failed
    except (tools.ToolError, EffectRejected) as exc:
        return Verdict.failed(f"{where}: {exc}")
    except EffectNotSent as exc:
        return Verdict.retry(f"{where}: not sent: {exc}", delay=exc.retry_after)
    except Exception as exc:  # a read-only call that broke: try again, within the cap
        log.warning("%s: %s: %s", where, type(exc).__name__, exc)
        return Verdict.retry(f"{where}: {type(exc).__name__}: {exc}")
