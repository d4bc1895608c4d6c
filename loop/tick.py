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
commits (`effects.send_all`). Read-only steps cut by a crash simply run again.

Which side-effect steps may share a batch is decided per step, from its tool and arguments,
before it starts: a call whose cut settles without a person (`Tool.repeatable`: a kind safe to
repeat, or a receiver that deduplicates by the effect id) may go with others; a call whose cut
would ask "Did this happen?" (or "May I do this?", had it not gone out) goes alone — a batch
holds at most `ASKING_AT_ONCE` of those, and the rest wait for a later tick (`DEFERRED`). So a
crash asks a person at most one question per worker.
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

from . import (
    actions,
    calls,
    conversation,
    effects,
    guard,
    journal,
    lease,
    open_steps,
    questions,
    sql,
    tools,
)
from .health import low_disk_reason
from .judges import Verdict
from .judges import tool as tool_judge
from .models import Effect, EffectState, EventKind, Step, StepState, Task, TaskState
from .states import TASK
from .transitions import move_step, move_steps

log = logging.getLogger("loop.runner")

# Side-effect steps whose cut would need a person's answer that one batch holds at once.
ASKING_AT_ONCE = 1


@dataclass
class Started:
    task_id: int
    epoch: int
    step: Step
    call: effects.Send | None = None  # its side-effect call, intent written with its start
    asks_if_cut: bool = False  # a side-effect call that is not safe to repeat


class Deferred:
    """A side-effect step not started because the batch holds enough such steps (or one that
    would ask if cut, for a step that would too); its lease let go."""


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
    # An API agent keeps its task between its steps (DESIGN.md §12): its lease is let go
    # only when it says so, when the lease runs out, or when the task is finished.
    keeps_lease: bool = False

    @property
    def actor(self) -> str:
        raise NotImplementedError

    @property
    def worker_id(self) -> int:
        raise NotImplementedError

    def _claim_batch(self) -> list[Begun]:
        """Inside one transaction: claim up to `batch_size` tasks and begin each. Claims go in
        rounds of as many tasks as the batch has room for, and never more than it has room for
        side-effect steps (a task begins one step at most). A claimed task whose step would ask
        if cut, while the batch holds one such, is deferred; then claiming stops (the deferred
        task's lease is free again: another round could take it back). Stops too when no more
        tasks are free, or the batch is full."""
        batch: list[Begun] = []
        with journal.batched():
            while True:
                room = self.batch_size - len(batch)
                room = min(room, self.effects_size - _effect_steps(batch))
                self.in_hand = ""  # a failure here is in "claiming a task"
                claimed = lease.claim_many(self.worker_id, room) if room > 0 else []
                if not claimed:
                    break
                begun = self._begin_claimed(
                    claimed, asking_room=ASKING_AT_ONCE - _asking_steps(batch)
                )
                batch += [b for b in begun if isinstance(b, Started | NeedsProbe)]
                if any(isinstance(b, Deferred) for b in begun):
                    break
            self.in_hand = named(batch)  # what the rest of its transaction would start
            self._intend_first_calls(batch)
        return batch

    def _commit_batch(
        self, verdicts: list[tuple[Started, Verdict]], waiting: list[Started]
    ) -> list[Begun]:
        """These verdicts, each fenced, in one transaction; with each `done` the start of that
        task's next step, unless it has side effects and the batch (with the steps still
        `waiting` to run) already holds `effects_size` such steps, or it would ask if cut and
        the batch holds `ASKING_AT_ONCE` such steps."""
        room = not low_disk_reason()
        names = named([started for started, _ in verdicts])
        with transaction.atomic(), journal.batched():
            self.in_hand = names  # a failure here loses all of them
            fences = lease.fenced_all(self.worker_id, [(s.task_id, s.epoch) for s, _ in verdicts])
            going_on = self._verdicts(verdicts, fences, chain=not self.once and room)
            steps = _first_open_steps([task.pk for task, _ in going_on])
            begun = self._begin_all(
                [(task, epoch, steps.get(task.pk)) for task, epoch in going_on],
                effects_room=self.effects_size - _effect_steps(waiting),
                asking_room=ASKING_AT_ONCE - _asking_steps(waiting),
            )
            batch = [b for b in begun if isinstance(b, Started | NeedsProbe)]
            self._intend_first_calls(batch)
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

    def _begin(self, task_id: int, epoch: int, probed: bool = False) -> Started | NeedsProbe | None:
        """`_begin_claimed` of one task."""
        [begun] = self._begin_claimed([(task_id, epoch)], probed=probed)
        assert not isinstance(begun, Deferred)
        return begun

    def _begin_claimed(
        self,
        claimed: list[tuple[int, int]],
        *,
        probed: bool = False,
        asking_room: int | None = None,
    ) -> list[Started | NeedsProbe | Deferred | None]:
        """Inside the transaction that claimed (or fenced) these tasks at these epochs:
        `_begin_all` of them, their rows and first open steps read with a statement each."""
        self._claimed_at = time.monotonic()  # chaining stops LOOP_CHAIN_SECONDS after it
        ids = [task_id for task_id, _ in claimed]
        marks = ", ".join("%s" for _ in ids)
        tasks = {task.pk: task for task in sql.load_all(Task, f"id IN ({marks})", ids)}
        steps = _first_open_steps(ids)
        held = [(tasks[task_id], epoch, steps.get(task_id)) for task_id, epoch in claimed]
        self.in_hand = ", ".join(
            f"task {task.pk} step '{step.key}'" if step else f"task {task.pk}"
            for task, _, step in held
        )
        return self._begin_all(held, probed=probed, asking_room=asking_room)

    def _begin_all(
        self,
        held: list[tuple[Task, int, Step | None]],
        *,
        probed: bool = False,
        effects_room: int | None = None,
        asking_room: int | None = None,
    ) -> list[Started | NeedsProbe | Deferred | None]:
        """Inside the caller's transaction, for each held task (at its lease epoch) with its
        first open step: guard the step and start it, or record why not (a question, the
        attempt cap, a wait) and let the lease go. The starts are written together, one
        statement for each kind of start. Once `effects_room` side-effect steps have begun, a
        further one is left for a later tick (`DEFERRED`, lease let go); so is a step that
        would ask if cut, once `asking_room` such steps have begun."""
        starts: list[tuple[Step, guard.Decision]] = []
        begun: list[Started | NeedsProbe | Deferred | None] = []
        for task, epoch, step in held:
            room = effects_room is None or _effect_steps(begun) < effects_room
            asking = asking_room is None or _asking_steps(begun) < asking_room
            begun.append(
                self._guard(
                    task, epoch, step, starts, probed=probed, side_effects=room, asking=asking
                )
            )
        self._start_all(starts)
        return begun

    def _guard(
        self,
        task: Task,
        epoch: int,
        step: Step | None,
        starts: list[tuple[Step, guard.Decision]],
        *,
        probed: bool,
        side_effects: bool,
        asking: bool,
    ) -> Started | NeedsProbe | Deferred | None:
        """One task of `_begin_all`: a step the guard lets start is added to `starts`. Without
        `side_effects` room a side-effect step is deferred; without `asking` room, one whose
        call is not safe to repeat."""
        if step is None or step.state == StepState.BLOCKED:
            actions.follow(task, actor=self.actor)
            self._let_go(task)
            return None
        tool = tools.find(step.tool)  # None if its app is gone: the judge fails it, naming it
        repeatable = step.side_effect and _repeatable(step, tool)
        if step.side_effect and not (side_effects and (asking or repeatable)):
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
        facts = guard.StepFacts(
            state=step.state,
            side_effect=step.side_effect,
            confirm_before=step.confirm_before,
            attempts=step.attempts,
            max_attempts=step.max_attempts,
            retry_recorded=step.retry_at is not None,
            authorized=bool(step.authorized_by),
            authorized_other_call=bool(step.authorized_by)
            and step.authorized_call != calls.of(step),
            repeatable=repeatable,
        )
        effect_facts = [
            guard.EffectFacts(e.state, e.safe_to_repeat, _live(e, now)) for e in step_effects
        ]
        decision = guard.decide(facts, effect_facts, resume_unsent=settings.LOOP_RESUME_UNSENT)
        if decision in ASKS_MAY_I and _standing(task):
            decision = guard.decide(
                facts, effect_facts, resume_unsent=settings.LOOP_RESUME_UNSENT, standing=True
            )
            if decision is guard.Decision.START_AUTO_CONFIRMED:
                rule = "confirm_before" if step.state == StepState.PENDING else "resume_unsent"
                journal.record(
                    EventKind.SIDE_EFFECT_AUTO_CONFIRMED,
                    step=step,
                    actor=self.actor,
                    run=task.origin_run_id,
                    message=task.origin_message_id,
                    rule=rule,
                )
        if decision.starts:
            starts.append((step, decision))
            return Started(task.pk, epoch, step, asks_if_cut=step.side_effect and not repeatable)
        if decision is guard.Decision.ASK_DID_IT_HAPPEN:
            uncertain = [e for e in step_effects if e.state == EffectState.UNCERTAIN]
            if not probed and any(_probe_of(e) and not e.evidence for e in uncertain):
                return NeedsProbe(task.pk, epoch, uncertain)  # keep the lease; ask the world
            self._ask(step, *questions.did_it_happen(uncertain))
        elif decision is guard.Decision.ASK_MAY_I_AGAIN:
            calls.journal_cleared(
                step, actor=self.actor, why="the call about to run is not the one it was given for"
            )
            target, summary = _describe(step, tool)
            cleared = {"authorized_by": "", "authorized_call": ""}
            self._ask(step, *questions.may_i(step.tool, target, summary, unsent=False), **cleared)
        elif decision in (guard.Decision.ASK_MAY_I, guard.Decision.ASK_MAY_I_UNSENT):
            target, summary = _describe(step, tool)
            unsent = decision is guard.Decision.ASK_MAY_I_UNSENT
            self._ask(step, *questions.may_i(step.tool, target, summary, unsent=unsent))
        elif decision is guard.Decision.FAIL_CAP:
            self._fail(step, f"gave up after {step.attempts} attempts (max {step.max_attempts})")
        elif decision is guard.Decision.WAIT:
            until = max(e.lease_until for e in step_effects if e.lease_until and _live(e, now))
            Task.objects.filter(pk=task.pk).update(run_after=until)
        task.refresh_from_db()
        actions.follow(task, actor=self.actor)
        self._let_go(task)
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

    def _start_all(self, starts: list[tuple[Step, guard.Decision]]) -> None:
        """Start these steps (first starts with one statement, restarts with another), and
        journal what let each one start where the guard says so."""
        now = timezone.now()
        notes = [
            (step, decision, step.authorized_by, step.authorized_call) for step, decision in starts
        ]
        first = [step for step, _ in starts if step.state == StepState.PENDING]
        again = [step for step, _ in starts if step.state != StepState.PENDING]
        for event, kind, moving in (
            ("start", EventKind.STEP_STARTED, first),
            ("restart", EventKind.STEP_RESTARTED, again),
        ):
            if not moving:
                continue
            fields = [
                {
                    "attempts": step.attempts + 1,
                    "started_at": now,
                    "retry_at": None,
                    "authorized_by": "",
                    "authorized_call": "",
                    "error": "",
                    "question_kind": "",
                    "question_text": "",
                }
                for step in moving
            ]
            cut = [{"cut": event == "restart" and step.retry_at is None} for step in moving]
            move_steps(moving, event, kind=kind, actor=self.actor, fields=fields, data=cut)
        for step, decision, authorized_by, call in notes:
            if decision is guard.Decision.START_AUTHORIZED:
                journal.record(
                    EventKind.AUTHORIZATION_CONSUMED,
                    step=step,
                    actor=self.actor,
                    by=authorized_by,
                    call=call,
                )
            elif decision is guard.Decision.START_RESUMED_UNSENT:
                journal.record(EventKind.SIDE_EFFECT_RESUMED_UNSENT, step=step, actor=self.actor)

    def _ask(self, step: Step, kind: str, text: str, **fields: str) -> None:
        move_step(
            step,
            "ask",
            kind=EventKind.STEP_BLOCKED,
            actor=self.actor,
            fields={"question_kind": kind, "question_text": text, "retry_at": None, **fields},
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
            self._verdicts([(started, verdict)], fence, chain=False)
        return not isinstance(fence[started.task_id], lease.LeaseLost)

    def _verdicts(
        self,
        verdicts: list[tuple[Started, Verdict]],
        fences: dict[int, Task | lease.LeaseLost],
        *,
        chain: bool,
    ) -> list[tuple[Task, int]]:
        """Inside the caller's transaction, given each task as fenced (locked) there, or why
        this worker no longer holds it: the verdicts (the `done` ones with one statement). A
        late one is journaled `late_result` and changes nothing. The tasks (with their epochs)
        whose next step to start now, under the same lease (what the next tick would do, minus
        a claim and a commit): with `chain`, those whose verdict was `done` while the task still
        runs and this worker may take work. Every other task's lease is let go. `chain` only if
        the disk has room."""
        landed: list[tuple[Task, Started, Verdict]] = []
        for started, verdict in verdicts:
            fence = fences[started.task_id]
            if isinstance(fence, lease.TaskGone):
                log.warning("verdict for %s dropped: %s", started.step, fence)
            elif isinstance(fence, lease.LeaseLost):
                journal.record(
                    EventKind.LATE_RESULT,
                    step=started.step,
                    actor=self.actor,
                    verdict=verdict.kind,
                    reason=str(fence),
                )
                log.warning("late verdict for %s refused: %s", started.step, fence)
            else:
                landed.append((fence, started, verdict))
        # The rows as our starts wrote them: only this lease holder changes a running step,
        # and every transition compares the state it expects.
        done = [(started.step, verdict) for _, started, verdict in landed if verdict.kind == "done"]
        if done:
            now = timezone.now()
            move_steps(
                [step for step, _ in done],
                "finish",
                kind=EventKind.STEP_DONE,
                actor=self.actor,
                fields=[
                    {"output": verdict.output, "finished_at": now, "retry_at": None}
                    for _, verdict in done
                ],
                data=[{} for _ in done],
            )
        going_on = []
        for task, started, verdict in landed:
            if chain and self._may_continue(task, verdict):
                # The next step's guard and start decide the task's fate: follow() would see
                # a running task whose first open step is not blocked, and change nothing.
                going_on.append((task, started.epoch))
                continue
            if verdict.kind == "done":
                actions.follow(task, actor=self.actor)
            else:
                self._apply(task, started.step, verdict)
            self._let_go(task)
        return going_on

    def _let_go(self, task: Task) -> None:
        """Give up the held task's lease (inside its fenced transaction), unless this holder
        keeps its task between steps and the task is not finished."""
        if self.keeps_lease and task.state not in TASK.terminal:
            return
        lease.release(task)

    def _may_continue(self, task: Task, verdict: Verdict) -> bool:
        return (
            verdict.kind == "done"
            and task.state == TaskState.RUNNING
            and not self.stopping
            # Let other tasks have a turn: the next claim takes the least-claimed task first.
            and time.monotonic() - self._claimed_at < settings.LOOP_CHAIN_SECONDS
        )

    def _apply(self, task: Task, step: Step, verdict: Verdict) -> None:
        """A verdict other than `done`, on its step and task."""
        if verdict.kind == "retry" and step.attempts < step.max_attempts:
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


def _effect_steps(batch: Sequence[Begun | Deferred | None]) -> int:
    """How many side-effect steps the batch holds (a step to probe is one)."""
    return sum(
        isinstance(b, NeedsProbe) or (isinstance(b, Started) and b.step.side_effect) for b in batch
    )


def _first_open_steps(task_ids: list[int]) -> dict[int, Step]:
    """Each task's first step that is neither done nor failed, in plan order, with one
    statement through the partial index step_open: bounded, however long the task's history."""
    return open_steps.first_open(task_ids)


ASKS_MAY_I = (guard.Decision.ASK_MAY_I, guard.Decision.ASK_MAY_I_UNSENT)


def _standing(task: Task) -> bool:
    """A standing authorization (§10): the task was created by a schedule's run whose message
    is still the conversation's latest. Asked only when the guard would ask "May I do this?"
    (one lookup on the messages' primary key)."""
    return task.origin_message_id is not None and task.origin_message_id == conversation.latest_id()


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
    return tool.summary(questions.asked_args(step))


def _asking_steps(batch: Sequence[Begun | Deferred | None]) -> int:
    """How many of the batch's side-effect steps would ask a person if cut (a step to probe
    is one: its effect was uncertain)."""
    return sum(
        isinstance(b, NeedsProbe) or (isinstance(b, Started) and b.asks_if_cut) for b in batch
    )


def _repeatable(step: Step, tool: tools.Tool | None) -> bool:
    """Whether the step's call, as its start will make it, settles without a person if cut."""
    if tool is None:
        return False
    # A kind safe to repeat is, whatever its arguments: spare resolving them.
    return tool.safe_to_repeat or tool.repeatable(questions.asked_args(step))
