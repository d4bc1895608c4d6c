"""A step's life (DESIGN.md §4, §5), as plain functions of an explicit holder (the lease's
owner, its epoch, the actor journaled): guard and start the step in the claim's commit
(`begin`), perform it through its judge (`perform`), commit its verdict fenced on the lease
epoch, and while the verdict is `done` start the task's next step in that same commit
(`commit`). The worker (`loop.worker`) and the API's `next`/`commit` both call these.

A worker's tick moves a batch of up to `LOOP_BATCH` tasks a step each, so one commit serves
them all:

    claim + guard + start, for each task      (one commit: every start durable before it runs,
                                               with the intent of each side-effect call known)
    → judge each step                         (the effects' claims commit, then the outcomes
                                               of those not safe to repeat)
    → each verdict fenced on its lease epoch, with the successes of the effects safe to
      repeat, and each next start             (one commit)

Read-only steps share a batch freely and run first, in turn. Up to `LOOP_BATCH_EFFECTS`
side-effect steps join a batch; they run last and together, their calls sharing the outbox's
commits (`effects.send_all`). Read-only steps cut by a crash simply run again. Which steps go
together is the worker's batch policy; these functions take the room it leaves (`Room`).

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
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from django.conf import settings
from django.db import DatabaseError, transaction
from django.utils import timezone

from . import (
    actions,
    calls,
    clock,
    conversation,
    effects,
    goals,
    guard,
    journal,
    lease,
    open_steps,
    plans,
    questions,
    sql,
    tools,
    transcript,
)
from .effects import Holder
from .judges import Judge, Verdict, Work
from .judges import of as judge_of
from .models import Effect, EffectState, EventKind, Step, StepState, Task, TaskState
from .outcomes import Fenced
from .states import TASK
from .transitions import move_step, move_steps, move_task

log = logging.getLogger("loop.step_life")

# Side-effect steps whose cut would need a person's answer that one batch holds at once.
ASKING_AT_ONCE = 1


@dataclass(frozen=True, eq=False)
class Started:
    """A step started under `holder`'s lease of its task, and its side-effect call if its
    judge knew it before the start (the call's intent written with the start)."""

    holder: Holder
    step: Step
    call: effects.Intent | None = None
    asks_if_cut: bool = False  # a side-effect call that is not safe to repeat
    # When its task was claimed (time.monotonic()): a chain of steps under one claim stops
    # LOOP_CHAIN_SECONDS after it.
    claimed_at: float = field(default_factory=time.monotonic)

    @property
    def task_id(self) -> int:
        return self.step.task_id

    @property
    def epoch(self) -> int:
        return self.holder.epoch


class Deferred:
    """A side-effect step not started because the batch holds enough such steps (or one that
    would ask if cut, for a step that would too); its lease let go."""


DEFERRED = Deferred()


@dataclass(frozen=True)
class NeedsProbe:
    """A task held at `holder`'s epoch whose step would ask "Did this happen?" about effects
    a probe may settle: look in the world (`probe_then_begin`) before asking a person."""

    task_id: int
    holder: Holder
    effects: list[Effect]


Begun = Started | NeedsProbe


@dataclass(frozen=True)
class Room:
    """How many more steps of each sort a batch may begin (None: no limit): side-effect
    steps, and those of them that would ask a person if cut."""

    effects: int | None = None
    asking: int | None = None


class WriteFailed(DatabaseError):
    """A write of a step's life failed; the message says where (task and step) and why."""

    def __init__(self, where: str, exc: DatabaseError) -> None:
        super().__init__(f"write failed in {where}: {type(exc).__name__}: {exc}")
        self.where = where


@contextmanager
def writing(where: str) -> Iterator[None]:
    """A database error inside says where it happened (a `WriteFailed`)."""
    try:
        yield
    except WriteFailed:
        raise
    except DatabaseError as exc:
        raise WriteFailed(where, exc) from exc


# ---- begin: guard and start ----------------------------------------------------------------


def begin(
    claimed: Sequence[tuple[int, Holder]],
    *,
    room: Room = Room(),
    probed: bool = False,
    keeps_lease: bool = False,
) -> list[Begun | Deferred | None]:
    """Inside the transaction that claimed (or fenced) these tasks (id, and holder at the
    claim's epoch): guard each task's first open step and start it, or record why not (a
    question, the attempt cap, a wait) and let the lease go (`keeps_lease`: an agent keeps
    its task). The starts are written together, one statement for each kind of start; the
    tasks' rows and first open steps are read with a statement each. Once `room` is used up,
    a further side-effect step is left for a later tick (`DEFERRED`, its lease let go)."""
    ids = [task_id for task_id, _ in claimed]
    tasks = {task.pk: task for task in sql.by_ids(Task, ids)}
    steps = open_steps.first_open(ids)
    now = time.monotonic()
    held = [Held(tasks[task_id], holder, steps.get(task_id), now) for task_id, holder in claimed]
    with writing(_held_names(held)):
        return _begin_held(held, room=room, probed=probed, keeps_lease=keeps_lease)


def begin_one(
    task_id: int, holder: Holder, *, probed: bool = False, keeps_lease: bool = False
) -> Begun | None:
    """`begin` of one task (the API's `next`, a test's claim)."""
    [begun] = begin([(task_id, holder)], probed=probed, keeps_lease=keeps_lease)
    assert not isinstance(begun, Deferred)
    return begun


def plan_calls(batch: Sequence[Begun]) -> list[Begun]:
    """Inside the transaction that starts the batch's steps: the intent of each side-effect
    step's call that its judge knows before it runs commits with its start (DESIGN.md §6: an
    intent committed before anything is sent), sparing the outbox a commit of its own. Only
    first starts: a step that ran before has its effects looked up when it runs again. The
    batch, each started step with its call."""
    requests: dict[int, effects.Request] = {}
    for n, begun in enumerate(batch):
        if isinstance(begun, Started) and begun.step.side_effect and begun.step.attempts == 1:
            request = judge_of(begun.step).plan_call(begun.step, begun.holder)
            if request is not None:
                requests[n] = request
    if not requests:
        return list(batch)
    with writing(named(batch)):
        planned = effects.intend_all(list(requests.values()), first_starts=True)
        intents = dict(zip(requests, planned, strict=True))
    return [
        replace(b, call=intents[n]) if n in intents and isinstance(b, Started) else b
        for n, b in enumerate(batch)
    ]


def probe_then_begin(need: NeedsProbe, *, keeps_lease: bool = False) -> Started | None:
    """Look in the world before asking a person. Probes are reads that may take a while,
    so they run after the claim committed; then the guard runs again, fenced."""
    with writing(f"task {need.task_id}"):
        for effect in need.effects:
            tool = tools.find(effect.tool)
            if tool is not None:
                effects.probe_and_settle(effect, tool, actor=need.holder.actor)
        with transaction.atomic():
            lease.fenced(need.task_id, need.holder.owner, need.holder.epoch)
            begun = begin_one(need.task_id, need.holder, probed=True, keeps_lease=keeps_lease)
    assert begun is None or isinstance(begun, Started)
    return begun


@dataclass(frozen=True)
class Held:
    """A task held under `holder`'s lease since `claimed_at`, with its first open step."""

    task: Task
    holder: Holder
    step: Step | None
    claimed_at: float


def _begin_held(
    held: list[Held],
    *,
    room: Room,
    probed: bool,
    keeps_lease: bool,
) -> list[Begun | Deferred | None]:
    """`begin` of tasks already read, each with its first open step (inside the caller's
    transaction)."""
    starts: list[tuple[Step, Holder, guard.Decision]] = []
    begun: list[Begun | Deferred | None] = []
    for one in held:
        side_effects = room.effects is None or effect_steps(begun) < room.effects
        asking = room.asking is None or asking_steps(begun) < room.asking
        begun.append(
            _guard(
                one,
                starts,
                probed=probed,
                side_effects=side_effects,
                asking=asking,
                keeps_lease=keeps_lease,
            )
        )
    _start_all(starts)
    # The deferred tasks' leases, let go together.
    lease.release_all([h.task for h, b in zip(held, begun, strict=True) if b is DEFERRED])
    return begun


def _guard(
    held: Held,
    starts: list[tuple[Step, Holder, guard.Decision]],
    *,
    probed: bool,
    side_effects: bool,
    asking: bool,
    keeps_lease: bool,
) -> Begun | Deferred | None:
    """One task of `begin`: a step the guard lets start is added to `starts`. Without
    `side_effects` room a side-effect step is deferred; without `asking` room, one whose
    call is not safe to repeat."""
    task, holder, step = held.task, held.holder, held.step
    actor = holder.actor
    if step is None or step.state == StepState.BLOCKED:
        actions.follow(task, actor=actor, current=step, let_go=not keeps_lease)
        _let_go(task, keeps_lease)
        return None
    tool = tools.find(step.tool)  # None if its app is gone: the judge fails it, naming it
    repeatable = step.side_effect and _repeatable(step, tool)
    if step.side_effect and not (side_effects and (asking or repeatable)):
        return DEFERRED  # its lease let go by the caller (`_begin_held`), with the others
    # A read-only step never has effects (the judge refuses side-effect tools for it),
    # nor does a step that never started.
    step_effects = list(step.effects.all()) if step.side_effect and step.attempts else []
    now = clock.now()  # the claims' times are the database's (loop/clock.py)
    for effect in step_effects:
        if effect.state == EffectState.RUNNING and not _live(effect, now):
            effects.doubt(
                effect, actor=actor, why="its claim lapsed before the outcome was recorded"
            )
    # A model step's calls are decided while it runs: its judge asks "May I do this?" about
    # each one as it comes, and answers a call cut before it was sent by sending it (§12).
    model = step.judge == "model"
    facts = guard.StepFacts(
        state=step.state,
        side_effect=step.side_effect,
        # LOOP_CONFIRM_SIDE_EFFECTS is a floor no plan lowers.
        confirm_before=(step.confirm_before or settings.LOOP_CONFIRM_SIDE_EFFECTS) and not model,
        attempts=step.attempts,
        max_attempts=step.max_attempts,
        retry_recorded=step.retry_at is not None,
        authorized=bool(step.authorized_by),
        authorized_other_call=bool(step.authorized_by) and step.authorized_call != calls.of(step),
        repeatable=repeatable or model,
        unasked=goals.unasked(step) and not model,
        proposed=step.proposed,
    )
    effect_facts = [
        guard.EffectFacts(e.state, e.safe_to_repeat, _live(e, now)) for e in step_effects
    ]
    decision = guard.decide(facts, effect_facts, resume_unsent=settings.LOOP_RESUME_UNSENT)
    if decision in ASKS_MAY_I and conversation.standing(task, step):
        decision = guard.decide(
            facts, effect_facts, resume_unsent=settings.LOOP_RESUME_UNSENT, standing=True
        )
        if decision is guard.Decision.START_AUTO_CONFIRMED:
            rule = "confirm_before" if step.state == StepState.PENDING else "resume_unsent"
            journal.record(
                EventKind.SIDE_EFFECT_AUTO_CONFIRMED,
                step=step,
                actor=actor,
                run=task.origin_run_id,
                message=task.origin_message_id,
                rule=rule,
            )
    if decision.starts:
        starts.append((step, holder, decision))
        asks = step.side_effect and not repeatable
        return Started(holder, step, asks_if_cut=asks, claimed_at=held.claimed_at)
    if decision is guard.Decision.ASK_DID_IT_HAPPEN:
        uncertain = [e for e in step_effects if e.state == EffectState.UNCERTAIN]
        if not probed and any(_probe_of(e) and not e.evidence for e in uncertain):
            return NeedsProbe(task.pk, holder, uncertain)  # keep the lease; ask the world
        _ask(step, actor, *questions.did_it_happen(uncertain))
    elif decision is guard.Decision.ASK_MAY_I_AGAIN:
        calls.journal_cleared(
            step, actor=actor, why="the call about to run is not the one it was given for"
        )
        target, summary = _describe(step, tool)
        cleared = {"authorized_by": "", "authorized_call": ""}
        _ask(step, actor, *questions.may_i(step.tool, target, summary, unsent=False), **cleared)
    elif decision in (guard.Decision.ASK_MAY_I, guard.Decision.ASK_MAY_I_UNSENT):
        target, summary = _describe(step, tool)
        unsent = decision is guard.Decision.ASK_MAY_I_UNSENT
        _ask(step, actor, *questions.may_i(step.tool, target, summary, unsent=unsent))
    elif decision is guard.Decision.AWAIT_APPROVAL:
        if task.state in (TaskState.RUNNING, TaskState.BLOCKED):
            move_task(task, "pause", actor=actor, data={"reason": goals.CHANGED})
    elif decision is guard.Decision.FAIL_CAP:
        _fail(step, actor, f"{gave_up(step.attempts)} (max {step.max_attempts})")
    elif decision is guard.Decision.WAIT:
        until = max(e.lease_until for e in step_effects if e.lease_until and _live(e, now))
        Task.objects.filter(pk=task.pk).update(run_after=until)
    task.refresh_from_db()
    actions.follow(task, actor=actor)
    _let_go(task, keeps_lease)
    return None


def _start_all(starts: list[tuple[Step, Holder, guard.Decision]]) -> None:
    """Start these steps (first starts with one statement, restarts with another), and
    journal what let each one start where the guard says so. One holder's starts share the
    statements (a batch is one worker's)."""
    now = timezone.now()
    notes = [
        (step, holder, d, step.authorized_by, step.authorized_call) for step, holder, d in starts
    ]
    for actor in sorted({holder.actor for _, holder, _ in starts}):
        mine = [step for step, holder, _ in starts if holder.actor == actor]
        first = [step for step in mine if step.state == StepState.PENDING]
        again = [step for step in mine if step.state != StepState.PENDING]
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
            move_steps(moving, event, kind=kind, actor=actor, fields=fields, data=cut)
    for step, holder, decision, authorized_by, call in notes:
        if decision is guard.Decision.START_AUTHORIZED:
            journal.record(
                EventKind.AUTHORIZATION_CONSUMED,
                step=step,
                actor=holder.actor,
                by=authorized_by,
                call=call,
            )
        elif decision is guard.Decision.START_RESUMED_UNSENT:
            journal.record(EventKind.SIDE_EFFECT_RESUMED_UNSENT, step=step, actor=holder.actor)


def _ask(step: Step, actor: str, kind: str, text: str, **fields: str) -> None:
    move_step(
        step,
        "ask",
        kind=EventKind.STEP_BLOCKED,
        actor=actor,
        fields={"question_kind": kind, "question_text": text, "retry_at": None, **fields},
        data={"question": kind},
    )


def _fail(step: Step, actor: str, error: str) -> None:
    actions.cancel_unsettled(step, actor=actor)
    move_step(
        step,
        "fail",
        kind=EventKind.STEP_FAILED,
        actor=actor,
        fields={"error": error, "finished_at": timezone.now(), "retry_at": None},
        data={"error": error},
    )


# ---- perform: the judge --------------------------------------------------------------------


def perform(turn: Sequence[Started]) -> list[tuple[Started, Verdict]]:
    """These started steps through their judges (inside no transaction: the outbox commits
    on its own), each judge's steps together; their verdicts. A step whose lease moved on is
    dropped (its new holder finishes it). One step's trouble is its own: an exception while
    it was judged is its retry, and a verdict the database could not store is made storable
    (`_storable`), so the others' verdicts commit; only a failed write ends the tick."""
    verdicts: dict[Started, Verdict | Fenced] = {}
    by_judge: dict[Judge, list[Started]] = {}
    for started in turn:
        by_judge.setdefault(judge_of(started.step), []).append(started)
    with writing(named(turn)):
        for judge, mine in by_judge.items():
            verdicts.update(zip(mine, _performed(judge, mine), strict=True))
    judged = []
    for started in turn:
        verdict = verdicts[started]
        if isinstance(verdict, Fenced):
            log.warning("task %s: %s", started.task_id, verdict.reason)
        else:
            judged.append((started, _storable(started.step, verdict)))
    return judged


def _performed(judge: Judge, mine: list[Started]) -> list[Verdict | Fenced]:
    """`judge.perform` of these steps. If it raises — anything but a failed write (DESIGN.md
    §11) — and which step broke is not known, each is performed again alone (what went out
    is answered from its receipt); the step that breaks alone gets a retry naming the
    exception, which counts toward its attempts, so the cap ends it."""
    try:
        return judge.perform([Work(s.step, s.holder, s.call) for s in mine])
    except DatabaseError:
        raise
    except lease.LeaseLost as exc:
        if len(mine) == 1:
            return [Fenced(str(exc))]
        return [verdict for one in mine for verdict in _performed(judge, [one])]
    except Exception as exc:
        if len(mine) > 1:
            return [verdict for one in mine for verdict in _performed(judge, [one])]
        log.exception("task %s step '%s': its judge failed", mine[0].task_id, mine[0].step.key)
        return [Verdict.retry(f"step '{mine[0].step.key}': {type(exc).__name__}: {exc}")]


def _storable(step: Step, verdict: Verdict) -> Verdict:
    """The verdict as the database can store it: a NUL or a lone surrogate in its texts is
    cleaned (`transcript.clean`); an output the database would refuse fails the step, naming
    what is wrong, rather than the whole batch's commit."""
    error = transcript.clean(verdict.error)[0]
    ask = verdict.ask
    if ask is not None:
        ask = (ask[0], transcript.clean(ask[1])[0])
    if verdict.kind == "done":
        problem = plans.check_value({"output": verdict.output}, "output", limit=None)
        if problem:
            error = f"step '{step.key}': its output can't be stored: {problem}"
            return replace(verdict, kind="failed", output=None, error=error)
    if error != verdict.error or ask != verdict.ask:
        return replace(verdict, error=error, ask=ask)
    return verdict


# ---- commit: the verdicts, fenced ----------------------------------------------------------


def commit(
    verdicts: Sequence[tuple[Started, Verdict]],
    *,
    chain: bool = False,
    room: Room = Room(),
    keeps_lease: bool = False,
) -> list[Begun]:
    """These verdicts, each fenced on its holder's epoch, in one transaction, with the
    receipts they carry (written whatever the fence says: those effects happened); a late
    verdict is journaled `late_result` and changes nothing. With `chain`, each `done` whose task runs on
    starts that task's next step in the same commit, under the same lease (what the next tick
    would do, minus a claim and a commit), within `room` and LOOP_CHAIN_SECONDS of the task's
    claim; those are returned, their planned calls' intents written. Every other task's lease
    is let go (`keeps_lease`: an agent keeps its task until it is finished)."""
    if not verdicts:
        return []
    receipts = [r for _, verdict in verdicts for r in verdict.receipts]
    with writing(named([started for started, _ in verdicts])), _receipts_kept(receipts):
        with transaction.atomic(), journal.batched():
            owner = verdicts[0][0].holder.owner
            fences = lease.fenced_all(owner, [(s.task_id, s.epoch) for s, _ in verdicts])
            effects.record_receipts(receipts)
            going_on = _verdicts(verdicts, fences, chain=chain, keeps_lease=keeps_lease)
            steps = open_steps.first_open([task.pk for task, _ in going_on])
            begun = _begin_held(
                [Held(task, s.holder, steps.get(task.pk), s.claimed_at) for task, s in going_on],
                room=room,
                probed=False,
                keeps_lease=keeps_lease,
            )
            return plan_calls([b for b in begun if isinstance(b, Started | NeedsProbe)])


@contextmanager
def _receipts_kept(receipts: Sequence[effects.Receipt]) -> Iterator[None]:
    """If the verdicts' commit fails, their receipts are written once more on their own before
    the failure goes on: an effect that happened stays known to have happened, and a step that
    would ask if cut does not ask about it for a failed write (as when its outcome had a commit
    of its own)."""
    states = [r.effect.state for r in receipts]  # as they were before the rolled-back writes
    try:
        yield
    except DatabaseError:
        if not receipts:
            raise
        for receipt, state in zip(receipts, states, strict=True):
            receipt.effect.state = state
        try:
            with transaction.atomic():
                effects.record_receipts(receipts)
        except DatabaseError as again:
            log.error("the receipts of %d effects could not be written: %s", len(receipts), again)
        raise


def commit_one(started: Started, verdict: Verdict, *, keeps_lease: bool = False) -> bool:
    """The verdict, fenced, no next step started (the API's `commit`): False if it came too
    late (journaled `late_result`)."""
    with writing(named([started])), transaction.atomic():
        fence = lease.fenced_all(started.holder.owner, [(started.task_id, started.epoch)])
        effects.record_receipts(verdict.receipts)
        _verdicts([(started, verdict)], fence, chain=False, keeps_lease=keeps_lease)
    return not isinstance(fence[started.task_id], lease.LeaseLost)


def _verdicts(
    verdicts: Sequence[tuple[Started, Verdict]],
    fences: dict[int, Task | lease.LeaseLost],
    *,
    chain: bool,
    keeps_lease: bool,
) -> list[tuple[Task, Started]]:
    """Inside the caller's transaction, given each task as fenced (locked) there, or why its
    holder no longer holds it: the verdicts (the `done` ones with one statement). The tasks
    (with their holders) whose next step to start now; every other task's lease let go."""
    landed: list[tuple[Task, Started, Verdict]] = []
    for started, verdict in verdicts:
        fence = fences[started.task_id]
        if isinstance(fence, lease.TaskGone):
            log.warning("verdict for %s dropped: %s", started.step, fence)
        elif isinstance(fence, lease.LeaseLost):
            journal.record(
                EventKind.LATE_RESULT,
                step=started.step,
                actor=started.holder.actor,
                verdict=verdict.kind,
                reason=str(fence),
            )
            log.warning("late verdict for %s refused: %s", started.step, fence)
        else:
            landed.append((fence, started, verdict))
    # The rows as our starts wrote them: only this lease holder changes a running step,
    # and every transition compares the state it expects.
    done = [(started, verdict) for _, started, verdict in landed if verdict.kind == "done"]
    if done:
        now = timezone.now()
        move_steps(
            [started.step for started, _ in done],
            "finish",
            kind=EventKind.STEP_DONE,
            actor=done[0][0].holder.actor,
            fields=[
                {"output": verdict.output, "finished_at": now, "retry_at": None}
                for _, verdict in done
            ],
            data=[{} for _ in done],
        )
    going_on = []
    for task, started, verdict in landed:
        actor = started.holder.actor
        if (
            chain
            and verdict.kind == "done"
            and task.state == TaskState.RUNNING
            # Let other tasks have a turn: the next claim takes the least-claimed task first.
            and time.monotonic() - started.claimed_at < settings.LOOP_CHAIN_SECONDS
        ):
            # The next step's guard and start decide the task's fate: follow() would see
            # a running task whose first open step is not blocked, and change nothing.
            going_on.append((task, started))
            continue
        if verdict.kind == "done":
            actions.follow(task, actor=actor)
        else:
            _apply(task, started.step, verdict, actor)
        _let_go(task, keeps_lease)
    return going_on


def _let_go(task: Task, keeps_lease: bool) -> None:
    """Give up the held task's lease (inside its fenced transaction), unless its holder
    keeps its task between steps and the task is not finished."""
    if keeps_lease and task.state not in TASK.terminal:
        return
    if task.lease_owner is None:
        return  # let go already, by the statement that ended the task (`actions.follow`)
    lease.release(task)


def _apply(task: Task, step: Step, verdict: Verdict, actor: str) -> None:
    """A verdict other than `done`, on its step and task."""
    if verdict.kind == "retry" and (verdict.refund or step.attempts < step.max_attempts):
        delay = verdict.delay
        if delay is None:
            delay = settings.LOOP_RETRY_BASE_SECONDS * 2 ** (step.attempts - 1)
        delay = min(delay, settings.LOOP_RETRY_MAX_SECONDS)
        retry_at = clock.now() + timedelta(seconds=delay)  # as the step shows it
        fields = {"retry_at": retry_at, "error": verdict.error}
        if verdict.refund:  # not the step's fault: this attempt does not count
            fields["attempts"] = step.attempts - 1
        move_step(
            step,
            "retry",
            kind=EventKind.STEP_RETRY,
            actor=actor,
            fields=fields,
            data={
                "retry_at": retry_at.isoformat(),
                "error": verdict.error,
                **({"refund": True} if verdict.refund else {}),
            },
        )
        # Due by the database's clock, which the claim compares it with.
        Task.objects.filter(pk=task.pk).update(run_after=clock.db_now(delay))
    elif verdict.kind == "blocked":
        uncertain = list(step.effects.filter(state=EffectState.UNCERTAIN))
        _ask(step, actor, *(verdict.ask or questions.did_it_happen(uncertain)))
        actions.follow(task, actor=actor)
    else:
        error = verdict.error
        if verdict.kind == "retry":
            error = f"{gave_up(step.attempts)}: {error}"
        _fail(step, actor, error)
        actions.after_step_failed(task, actor=actor)


# ---- what a batch holds --------------------------------------------------------------------


def named(batch: Sequence[Begun]) -> str:
    """The batch's tasks and steps, for an error message."""
    return ", ".join(
        f"task {b.task_id} step '{b.step.key}'" if isinstance(b, Started) else f"task {b.task_id}"
        for b in batch
    )


def _held_names(held: Sequence[Held]) -> str:
    return ", ".join(
        f"task {h.task.pk} step '{h.step.key}'" if h.step else f"task {h.task.pk}" for h in held
    )


def effect_steps(batch: Sequence[Begun | Deferred | None]) -> int:
    """How many side-effect steps the batch holds (a step to probe is one)."""
    return sum(
        isinstance(b, NeedsProbe) or (isinstance(b, Started) and b.step.side_effect) for b in batch
    )


ASKS_MAY_I = (guard.Decision.ASK_MAY_I, guard.Decision.ASK_MAY_I_UNSENT)


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


def asking_steps(batch: Sequence[Begun | Deferred | None]) -> int:
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


def gave_up(attempts: int) -> str:
    """A failed step's reason begins with how often it was tried, in words."""
    return f"gave up after {attempts} attempt{'' if attempts == 1 else 's'}"
