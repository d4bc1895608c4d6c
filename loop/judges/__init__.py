"""Judges execute a step and say what should become of it (DESIGN.md §12).

Three judges share one step life (`loop.step_life`: guard and start, effects, fenced verdict):

- the tool judge (`judges.tool`): runs the step's fixed call;
- the model judge (Pippa): a model's turn at each tick, many tool calls decided at run time,
  each side-effect call through the guard and the outbox, a durable transcript;
- the outside agent: drives the step over the API (`next` … its own work … `commit`), so the
  worker never judges its steps; its side-effect calls go through the same outbox.

A judge the worker runs is a `Judge`: `perform` takes a turn of steps (the worker's batch, all
of one judge) and says each one's verdict. A judge whose step's side-effect call is known
before the step runs says so in `plan_call`: then its intent is written with the step's start,
and a batch's calls share the outbox's commits (`LOOP_BATCH_EFFECTS`). A judge that decides
its calls at run time answers None there, and sends each call through the outbox itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import model, tool
from .base import Judge, Verdict, Work, verdict_of

if TYPE_CHECKING:
    from ..models import Step

__all__ = ["Judge", "Verdict", "Work", "of", "verdict_of"]


def of(step: Step) -> Judge:
    """The judge that performs this step: `judge: model` steps are the model's."""
    return model.JUDGE if step.judge == "model" else tool.JUDGE
