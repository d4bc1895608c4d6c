"""The tool judge (default, no network of its own): run the step's tool with its args, the
args' `${key.path}` references filled from earlier steps' outputs."""

from __future__ import annotations

import logging

from django.db import DatabaseError

from .. import effects, plans, tools
from ..lease import LeaseLost
from ..models import Step, StepState
from . import Verdict

log = logging.getLogger("loop.judge")


def run(step: Step, holder: effects.Holder) -> Verdict:
    with tools.calling(tools.Call.of(step, holder.owner, holder.epoch)):
        return _run(step, holder)


def _run(step: Step, holder: effects.Holder) -> Verdict:
    where = f"step '{step.key}'"
    try:
        tool = tools.get(step.tool)
        args = step.args
        if plans.references(args):
            outputs = dict(
                Step.objects.filter(task_id=step.task_id, state=StepState.DONE).values_list(
                    "key", "output"
                )
            )
            args = plans.resolve(args, outputs)
        problems = tool.check_args(args, where)
        if problems:
            return Verdict.failed("; ".join(problems))
        reason = tool.disabled()
        if reason:
            return Verdict.failed(f"{where}: tool '{tool.name}' is off: {reason}")
        if not tool.side_effect:
            return Verdict.done(tool.run(args))
        if not step.side_effect:
            return Verdict.failed(
                f"{where} is read-only, but tool '{tool.name}' has side effects: nothing was sent"
            )
        return Verdict.done(effects.call(holder, step, tool, args))
    except (DatabaseError, LeaseLost):
        raise  # the runner's business: a write failed, or the lease moved on
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
