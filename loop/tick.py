"""A step's life inside a tick (DESIGN.md §4, §5): guard and start it in the claim's commit,
commit its verdict fenced on the lease epoch, and while the verdict is `done` start the task's
next step in that same commit. Mixed into the Runner, which owns the worker's life cycle.

A tick moves a batch of up to `LOOP_BATCH` tasks a step each, so one commit serves them all:

    claim + guard + start, for each task      (one commit: every start durable before it runs,
                                               with the intent of each side-effect call known)
    → judge each step                         (the effects' claims commit, then their outcomes)
    → each verdict fenced on its lease epoch, and each next start   (one commit)

Read-only steps share a batch freely and run first, in turn. Up to `LOOP_BATCH_EFFECTS`
side-effect steps join a batch; they run last and together, their calls sharing the outbox's
commits (`effects.send_all`), so a crash leaves at most that many effects to settle by §5.
Read-only steps cut by a crash simply run again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from . import actions, effects, guard, journal, lease, questions, rows, tools
from .health import low_disk_reason
from .judges import Verdict
from .judges import tool as tool_judge
from .models import Effect, EffectState, EventKind, Step, StepState, Task, TaskState
from .transitions import move_step

log = logging.getLogger("loop.runner")


@dataclass
class Started:
    task_id: int
    epoch: int
    step: Step
    call: effects.Send | None = None  # its side-effect call, intent written with its start


class Late:
    """A verdict refused by the fencing check (journaled as `late_result`)."""


LATE = Late()


class Deferred:
    """A side-effect step not started because the batch holds enough; lease let go."""


DEFERRED = Deferred()


@dataclass
class NeedsProbe:
    task_id: int
    epoch: int
    effects: list[Effect]


Begun = Started | NeedsProbe


class StepLifecycle:
    """The tick's transactions. Expects the worker's `actor`, `worker_id`, `stopping`."""

    stopping: bool
    once: bool
    batch_size: int
    effects_size: int
    in_hand: str
    _claimed_at: float

    @property
    def actor(self) -> str:
        raise NotImplementedError

    @property
    def worker_id(self) -> int:
        raise NotImplementedError

    def _claim_batch(self) -> list[Begun]:
        """Inside one transaction: claim up to `batch_size` tasks and begin each. Stops early
        when no task is free, or once the batch holds `effects_size` side-effect steps."""
        batch: list[Begun] = []
        with journal.batched():
            while len(batch) < self.batch_size and _effect_steps(batch) < self.effects_size:
                self.in_hand = ""  # a failure here is in "claiming a task"
                claimed = lease.claim(self.worker_id)
                if claimed is None:
                    break
                begun = self._begin(*claimed)
                if isinstance(begun, Started | NeedsProbe):
                    batch.append(begun)
            self.in_hand = named(batch)  # what the rest of its transaction would start
            self._intend_first_calls(batch)
        return batch

    def _commit_batch(
        self, verdicts: list[tuple[Started, Verdict]], waiting: list[Started]
    ) -> list[Begun]:
        """These verdicts, each fenced, in one transaction; with each `done` the start of that
        task's next step, unless it has side effects and the batch (with the steps still
        `waiting` to run) already holds `effects_size` such steps."""
        batch: list[Begun] = []
        room = not low_disk_reason()
        names = named([started for started, _ in verdicts])
        with transaction.atomic(), journal.batched():
            self.in_hand = names
            fences = lease.fenced_all(self.worker_id, [(s.task_id, s.epoch) for s, _ in verdicts])
            for started, verdict in verdicts:
                self.in_hand = f"task {started.task_id} step '{started.step.key}'"
                room_for_effects = _effect_steps([*waiting, *batch]) < self.effects_size
                begun = self._verdict(
                    started,
                    verdict,
                    fences[started.task_id],
                    chain=not self.once and room,
                    side_effects=room_for_effects,
                )
                if isinstance(begun, Started | NeedsProbe):
                    batch.append(begun)
            self._intend_first_calls(batch)
            self.in_hand = names  # what a failing COMMIT would lose
        return batch

    def _intend_first_calls(self, batch: list[Begun]) -> None:
        """Inside the transaction that starts the batch's steps: the intent of each side-effect
        step's call that is known before it runs commits with its start (DESIGN.md §6: an
        intent committed before anything is sent), sparing the outbox a commit of its own. Only
        first starts: a step that ran before has its effects looked up when it runs again."""
        calls = []
        for begun in batch:
            if isinstance(begun, Started) and begun.step.side_effect and begun.step.attempts == 1:
                holder = effects.Holder(self.worker_id, begun.epoch, self.actor)
                begun.call = tool_judge.side_effect_call(begun.step, holder)
                if begun.call is not None:
                    calls.append(begun.call)
        effects.intend_all(calls)

    def _begin(
        self,
        task_id: int,
        epoch: int,
        probed: bool = False,
        task: Task | None = None,
        *,
        side_effects: bool = True,
    ) -> Started | NeedsProbe | Deferred | None:
        """Inside the claim's (or the previous verdict's) transaction: guard the first open
        step and start it, or record why not (a question, the attempt cap, a wait) and let
        the lease go. `task` is the row if the caller already read it in this transaction.
        Without `side_effects`, a side-effect step is left for a later tick."""
        fresh = task is None  # a fresh claim (not a chained start)
        if task is None:
            self._claimed_at = time.monotonic()  # chaining stops LOOP_CHAIN_SECONDS after it
            task = rows.load(Task, "id = %s", [task_id])
            assert task is not None
        # Step.objects.open().first(), in plan order (index step_position_unique).
        step = rows.load(
            Step,
            "task_id = %s AND state NOT IN (%s, %s)",
            [task.pk, StepState.DONE, StepState.FAILED],
            order="position",
        )
        if fresh:  # a chained start's failure is in its predecessor's verdict commit
            self.in_hand = f"task {task_id} step '{step.key}'" if step else f"task {task_id}"
        if step is None or step.state == StepState.BLOCKED:
            actions.follow(task, actor=self.actor)
            lease.release(task)
            return None
        if step.side_effect and not side_effects:
            lease.release(task)
            return DEFERRED
        # A read-only step never has effects (the judge refuses side-effect tools for it),
        # nor does a step that never started.
        step_effects = list(step.effects.all()) if step.side_effect and step.attempts else []
        now = timezone.now()
        for effect in step_effects:
            if effect.state == EffectState.RUNNING and not _live(effect, now):
                effects.doubt(
                    effect, actor=self.actor, why="its claim lapsed before the outcome was recorded"
                )
        tool = tools.find(step.tool)  # None if its app is gone: the judge fails it, naming it
        facts = guard.StepFacts(
            state=step.state,
            side_effect=step.side_effect,
            confirm_before=step.confirm_before,
            attempts=step.attempts,
            max_attempts=step.max_attempts,
            retry_recorded=step.retry_at is not None,
            authorized=bool(step.authorized_by),
            repeatable=bool(tool and tool.safe_to_repeat),
        )
        decision = guard.decide(
            facts,
            [guard.EffectFacts(e.state, e.safe_to_repeat, _live(e, now)) for e in step_effects],
            resume_unsent=settings.LOOP_RESUME_UNSENT,
        )
        if decision.starts:
            self._start(step, decision)
            return Started(task_id, epoch, step)
        if decision is guard.Decision.ASK_DID_IT_HAPPEN:
            uncertain = [e for e in step_effects if e.state == EffectState.UNCERTAIN]
            if not probed and any(_probe_of(e) and not e.evidence for e in uncertain):
                return NeedsProbe(task_id, epoch, uncertain)  # keep the lease; ask the world
            self._ask(step, *questions.did_it_happen(uncertain))
        elif decision in (guard.Decision.ASK_MAY_I, guard.Decision.ASK_MAY_I_UNSENT):
            target, summary = _describe(step, tool)
            unsent = decision is guard.Decision.ASK_MAY_I_UNSENT
            self._ask(step, *questions.may_i(step.tool, target, summary, unsent=unsent))
        elif decision is guard.Decision.FAIL_CAP:
            self._fail(step, f"gave up after {step.attempts} attempts (max {step.max_attempts})")
        elif decision is guard.Decision.WAIT:
            until = max(e.lease_until for e in step_effects if e.lease_until and _live(e, now))
            Task.objects.filter(pk=task_id).update(run_after=until)
        task.refresh_from_db()
        actions.follow(task, actor=self.actor)
        lease.release(task)
        return None

    def _probe_then_begin(self, need: NeedsProbe) -> Started | None:
        """Look in the world before asking a person. Probes are reads that may take a while,
        so they run after the claim committed; then the guard runs again, fenced."""
        for effect in need.effects:
            tool = tools.find(effect.tool)
            if tool is not None:
                effects.probe_and_settle(effect, tool, actor=self.actor)
        with transaction.atomic():
            lease.fenced(need.task_id, self.worker_id, need.epoch)
            begun = self._begin(need.task_id, need.epoch, probed=True)
        assert begun is None or isinstance(begun, Started)
        return begun

    def _start(self, step: Step, decision: guard.Decision) -> None:
        now = timezone.now()
        event = "start" if step.state == StepState.PENDING else "restart"
        kind = EventKind.STEP_STARTED if event == "start" else EventKind.STEP_RESTARTED
        authorized_by = step.authorized_by
        move_step(
            step,
            event,
            kind=kind,
            actor=self.actor,
            fields={
                "attempts": step.attempts + 1,
                "started_at": now,
                "retry_at": None,
                "authorized_by": "",
                "error": "",
                "question_kind": "",
                "question_text": "",
            },
            data={"cut": event == "restart" and step.retry_at is None},
        )
        if decision is guard.Decision.START_AUTHORIZED:
            journal.record(
                EventKind.AUTHORIZATION_CONSUMED, step=step, actor=self.actor, by=authorized_by
            )
        elif decision is guard.Decision.START_RESUMED_UNSENT:
            journal.record(EventKind.SIDE_EFFECT_RESUMED_UNSENT, step=step, actor=self.actor)
        elif decision is guard.Decision.START_AUTO_CONFIRMED:
            journal.record(EventKind.SIDE_EFFECT_AUTO_CONFIRMED, step=step, actor=self.actor)

    def _ask(self, step: Step, kind: str, text: str) -> None:
        move_step(
            step,
            "ask",
            kind=EventKind.STEP_BLOCKED,
            actor=self.actor,
            fields={"question_kind": kind, "question_text": text, "retry_at": None},
            data={"question": kind},
        )

    def _fail(self, step: Step, error: str) -> None:
        actions.cancel_unsettled(step, actor=self.actor)
        move_step(
            step,
            "fail",
            kind=EventKind.STEP_FAILED,
            actor=self.actor,
            fields={"error": error, "finished_at": timezone.now(), "retry_at": None},
        )

    def commit(self, started: Started, verdict: Verdict) -> bool:
        """The verdict, fenced: it lands only while this worker still holds the lease at its
        epoch. A late verdict is journaled as `late_result` and changes nothing. No next step
        is started (the worker's batches do that in `_commit_batch`)."""
        with transaction.atomic():
            fence = lease.fenced_all(self.worker_id, [(started.task_id, started.epoch)])
            return self._verdict(started, verdict, fence[started.task_id], chain=False) is not LATE

    def _verdict(
        self,
        started: Started,
        verdict: Verdict,
        fence: Task | lease.LeaseLost,
        *,
        chain: bool,
        side_effects: bool = True,
    ) -> Started | NeedsProbe | Deferred | None | Late:
        """Inside the caller's transaction, given the task as fenced (locked) there, or why this
        worker no longer holds it: the verdict, and with `chain` the start of the task's next
        step under the same lease (what the next tick would do, minus a claim and a commit),
        while the verdict was `done`, the task still runs and this worker may take work.
        `chain` only if the disk has room."""
        if isinstance(fence, lease.TaskGone):
            log.warning("verdict for %s dropped: %s", started.step, fence)
            return LATE
        if isinstance(fence, lease.LeaseLost):
            exc = fence
            journal.record(
                EventKind.LATE_RESULT,
                step=started.step,
                actor=self.actor,
                verdict=verdict.kind,
                reason=str(exc),
            )
            log.warning("late verdict for %s refused: %s", started.step, exc)
            return LATE
        task = fence
        # The row as our start wrote it: only this lease holder changes a running step,
        # and every transition compares the state it expects.
        step = started.step
        if chain and self._may_continue(task, verdict):
            # The next step's guard and start decide the task's fate: follow() would see
            # a running task whose first open step is not blocked, and change nothing.
            self._apply(task, step, verdict, follow=False)
            return self._begin(task.pk, started.epoch, task=task, side_effects=side_effects)
        self._apply(task, step, verdict)
        lease.release(task)
        return None

    def _may_continue(self, task: Task, verdict: Verdict) -> bool:
        return (
            verdict.kind == "done"
            and task.state == TaskState.RUNNING
            and not self.stopping
            # Let other tasks have a turn: the next claim takes the least-claimed task first.
            and time.monotonic() - self._claimed_at < settings.LOOP_CHAIN_SECONDS
        )

    def _apply(self, task: Task, step: Step, verdict: Verdict, *, follow: bool = True) -> None:
        if verdict.kind == "done":
            move_step(
                step,
                "finish",
                kind=EventKind.STEP_DONE,
                actor=self.actor,
                fields={"output": verdict.output, "finished_at": timezone.now(), "retry_at": None},
            )
            if follow:
                actions.follow(task, actor=self.actor)
        elif verdict.kind == "retry" and step.attempts < step.max_attempts:
            delay = verdict.delay
            if delay is None:
                delay = settings.LOOP_RETRY_BASE_SECONDS * 2 ** (step.attempts - 1)
            retry_at = timezone.now() + timedelta(
                seconds=min(delay, settings.LOOP_RETRY_MAX_SECONDS)
            )
            move_step(
                step,
                "retry",
                kind=EventKind.STEP_RETRY,
                actor=self.actor,
                fields={"retry_at": retry_at, "error": verdict.error},
                data={"retry_at": retry_at.isoformat(), "error": verdict.error},
            )
            Task.objects.filter(pk=task.pk).update(run_after=retry_at)
        elif verdict.kind == "blocked":
            uncertain = list(step.effects.filter(state=EffectState.UNCERTAIN))
            self._ask(step, *questions.did_it_happen(uncertain))
            actions.follow(task, actor=self.actor)
        else:
            error = verdict.error
            if verdict.kind == "retry":
                error = f"gave up after {step.attempts} attempts: {error}"
            self._fail(step, error)
            actions.after_step_failed(task, actor=self.actor)


def named(batch: Sequence[Begun]) -> str:
    return ", ".join(
        f"task {b.task_id} step '{b.step.key}'" if isinstance(b, Started) else f"task {b.task_id}"
        for b in batch
    )


def _effect_steps(batch: list[Begun]) -> int:
    """How many side-effect steps the batch holds (a step to probe is one)."""
    return sum(isinstance(b, NeedsProbe) or b.step.side_effect for b in batch)


def _live(effect: Effect, now: datetime) -> bool:
    return effect.state == EffectState.RUNNING and bool(
        effect.lease_until and effect.lease_until > now
    )


def _probe_of(effect: Effect) -> object:
    tool = tools.find(effect.tool)
    return tool.probe if tool else None


def _describe(step: Step, tool: tools.Tool | None) -> tuple[str, str]:
    if tool is None:
        return "", f"tool '{step.tool}' is not installed"
    try:
        outputs = dict(step.task.steps.filter(state=StepState.DONE).values_list("key", "output"))
        from .plans import resolve

        return tool.summary(resolve(step.args, outputs))
    except tools.ToolError:
        return tool.summary(step.args)
