"""Cuts, simulated in process and deterministically: a worker claims and starts a step, gets
partway through it, and is never heard from again; its leases run out and another worker ticks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from django.db import transaction

from loop import effects, lease, step_life, tools
from loop.models import Effect, Step, Task
from loop.step_life import Started
from loop.worker import Worker

from ..conftest import step


class Killed(BaseException):
    """The process died here: nothing after this line ran, no outcome was recorded."""


Partway = Callable[[Step, effects.Holder], None]


def cut(task: Task, partway: Partway | None = None) -> Started:
    """Claim and start the task's step in a worker, run `partway`, then lose that worker: its
    task lease and its effects' claims run out."""
    doomed = Worker(label="doomed")
    doomed.boot()
    with transaction.atomic():
        claimed = lease.claim(doomed.worker_id)
        assert claimed is not None and claimed[0] == task.pk
        started = step_life.begin_one(claimed[0], doomed.holding(claimed[1]))
    assert isinstance(started, Started), started
    if partway is not None:
        try:
            partway(started.step, started.holder)
        except Killed:
            pass
    Task.objects.filter(pk=task.pk).update(lease_until=None)
    Effect.objects.filter(task=task).update(lease_until=None)
    return started


def next_worker() -> Worker:
    runner = Worker(label="next")
    runner.boot()
    return runner


def call_step_tool(step: Step, holder: effects.Holder, *, die: str | None = None) -> None:
    """Run the step's tool through the effect layer; `die` "before" or "after" performing."""
    tool = tools.get(step.tool)

    def run(args: dict[str, Any], effect_id: str) -> dict[str, Any]:
        if die == "before":
            raise Killed
        result = tool.run(args, effect_id)
        if die == "after":
            raise Killed
        return result

    effects.call(holder, step, dataclasses.replace(tool, run=run), step.args)


def sent_and_recorded(step: Step, holder: effects.Holder) -> None:
    call_step_tool(step, holder)
    raise Killed  # before the verdict committed


def sent_not_recorded(step: Step, holder: effects.Holder) -> None:
    call_step_tool(step, holder, die="after")


def claimed_not_sent(step: Step, holder: effects.Holder) -> None:
    call_step_tool(step, holder, die="before")


def intent_only(step: Step, holder: effects.Holder) -> None:
    effects.intend_all([effects.Request(holder, step, tools.get(step.tool), step.args)])
    raise Killed


def post(url: str, **fields: Any) -> dict[str, Any]:
    return step("pay", "http.post", args={"url": url, "json": {"amount": 5}}, **fields)
