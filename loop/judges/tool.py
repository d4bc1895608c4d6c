"""The tool judge (default, no network of its own): run the step's tool with its args, the
args' `${key.path}` references filled from earlier steps' outputs.

`run_all` judges several steps (a worker's batch): read-only tools run in turn, and the
side-effect calls go through the outbox together (`effects.send_all`), sharing its commits.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

from django.db import DatabaseError

from .. import effects, plans, tools
from ..lease import LeaseLost
from ..models import Step, StepState
from . import Verdict

log = logging.getLogger("loop.judge")
T = TypeVar("T")


def run(step: Step, holder: effects.Holder) -> Verdict:
    [verdict] = run_all([(step, holder, None)])
    if isinstance(verdict, LeaseLost):
        raise verdict
    return verdict


def run_all(
    steps: list[tuple[Step, effects.Holder, effects.Send | None]],
) -> list[Verdict | LeaseLost]:
    """Each step's verdict, in order; LeaseLost for a step whose lease moved on (its new
    holder finishes it). A step may come with its call already made known (`side_effect_call`,
    its intent written). A failed write raises (DatabaseError): the runner's business."""
    prepared: list[Verdict | LeaseLost | effects.Send] = []
    for step, holder, known in steps:
        if known is not None:
            prepared.append(known)
            continue
        with tools.calling(tools.Call.of(step, holder.owner, holder.epoch)):
            prepared.append(_judged(step, partial(_prepare, step, holder)))
    sends = [p for p in prepared if isinstance(p, effects.Send)]
    if sends:
        effects.send_all(sends)
    return [
        _judged(p.step, partial(_answered, p)) if isinstance(p, effects.Send) else p
        for p in prepared
    ]


def side_effect_call(step: Step, holder: effects.Holder) -> effects.Send | None:
    """The call this side-effect step will make, known before it runs (so its intent can be
    written with its start); None if the judge will only tell when the step runs (arguments
    that do not check out, a tool that is off or missing or has no side effects)."""
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
    return call if isinstance(call, effects.Send) else None


def _prepare(step: Step, holder: effects.Holder) -> Verdict | effects.Send:
    """A read-only call runs now; a side-effect call is handed back, to go to the outbox."""
    where = f"step '{step.key}'"
    tool = tools.get(step.tool)
    args = resolved_args(step)
    problems = plans.check_call(tool, args, where=where)
    if problems:
        return Verdict.failed("; ".join(problems))
    if not tool.side_effect:
        return Verdict.done(tool.run(args))
    if not step.side_effect:
        return Verdict.failed(
            f"{where} is read-only, but tool '{tool.name}' has side effects: nothing was sent"
        )
    return effects.Send(holder, step, tool, args)


def resolved_args(step: Step) -> dict[str, Any]:
    """The step's args, their `${key.path}` references filled from earlier steps' outputs
    (ToolError if one cannot be)."""
    keys = plans.references(step.args)
    if not keys:
        return step.args
    # Only the steps named, through the index step_key_unique (task, key): never the whole plan.
    outputs = dict(
        Step.objects.filter(
            task_id=step.task_id, key__in=sorted(keys), state=StepState.DONE
        ).values_list("key", "output")
    )
    return plans.resolve(step.args, outputs)


def _answered(send: effects.Send) -> Verdict:
    return Verdict.done(send.outcome())


def _judged(step: Step, judge: Callable[[], T]) -> T | Verdict | LeaseLost:
    """What `judge` returns, or the verdict its exception means."""
    where = f"step '{step.key}'"
    try:
        return judge()
    except LeaseLost as exc:
        return exc
    except DatabaseError:
        raise  # the runner's business: a write failed
    except (tools.ToolError, effects.EffectRejected) as exc:
        return Verdict.failed(f"{where}: {exc}")
    except effects.EffectNotSent as exc:
        return Verdict.retry(f"{where}: not sent: {exc}", delay=exc.retry_after)
    except effects.StepMustAsk as exc:
        return Verdict.blocked(f"{where}: may have happened: {exc}")
    except effects.EffectBusy as exc:
        return Verdict.retry(f"{where}: {exc}")
    except Exception as exc:  # a read-only call that broke: try again, within the cap
        log.warning("%s: %s: %s", where, type(exc).__name__, exc)
        return Verdict.retry(f"{where}: {type(exc).__name__}: {exc}")
