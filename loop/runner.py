"""The worker: boot reconciliation, the tick, heartbeats and signals (DESIGN.md §4, §8, §9).

tick = claim + guard + start  (one commit)
     → judge (effects commit on their own)
     → verdict, fenced on the lease epoch (one commit)
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import FrameType

from django.conf import settings
from django.db import DatabaseError, close_old_connections, connections, transaction
from django.utils import timezone

from . import actions, effects, guard, journal, lease, questions, rows, tools
from .boot import proc_start_time, reconcile
from .health import low_disk_reason
from .judges import Verdict
from .judges import tool as tool_judge
from .models import (
    Effect,
    EffectState,
    EventKind,
    Step,
    StepState,
    Task,
    TaskState,
    Worker,
    WorkerState,
)
from .transitions import move_step

log = logging.getLogger("loop.runner")


@dataclass
class Started:
    task_id: int
    epoch: int
    step: Step


class Late:
    """A verdict refused by the fencing check (journaled as `late_result`)."""


LATE = Late()


@dataclass
class NeedsProbe:
    task_id: int
    epoch: int
    effects: list[Effect]


class Runner:
    def __init__(self, *, label: str = "", once: bool = False) -> None:
        self.label = label
        self.once = once
        self.worker: Worker | None = None
        self.stopping = False
        self.parked_reason = ""
        self.unrecorded_error = ""
        self.current: Started | None = None
        self.current_since = 0.0
        self.in_hand = ""  # the task and step being claimed or started, for error messages
        self._found_work = False
        self._claimed_at = 0.0  # when this tick claimed its task: chaining stops after a while
        self._lock = threading.Lock()
        self._beat_stop = threading.Event()

    @property
    def actor(self) -> str:
        assert self.worker is not None
        return f"worker:{self.worker.pk}"

    # ---- life cycle ------------------------------------------------------------------------

    def boot(self) -> dict[str, int]:
        """Retire dead owners' effects first, then register this incarnation."""
        counts = reconcile(actor=f"boot:{socket.gethostname()}:{os.getpid()}")
        with transaction.atomic():
            self.worker = Worker.objects.create(
                label=self.label,
                host=socket.gethostname(),
                pid=os.getpid(),
                pid_started=proc_start_time(os.getpid()),
            )
            journal.record(
                EventKind.WORKER_STARTED, actor=self.actor, label=self.label, reconciled=counts
            )
        log.info("%s started (reconciled %s)", self.worker, counts)
        return counts

    def run(self) -> None:
        self.boot()
        self._install_signals()
        beat = threading.Thread(target=self._heartbeat, name="heartbeat", daemon=True)
        beat.start()
        failures = 0
        try:
            while not self.stopping:
                close_old_connections()
                try:
                    found = self.tick()
                    failures = 0
                except DatabaseError:
                    failures += 1
                    found = False
                if self.once:
                    break
                if not found and not self.stopping:
                    delay = settings.LOOP_IDLE_SLEEP_MS / 1000
                    time.sleep(min(delay * (2**failures), 10.0) if failures else delay)
        finally:
            self._beat_stop.set()
            beat.join(timeout=5)
            self._stopped()

    def _install_signals(self) -> None:
        def handle(signum: int, frame: FrameType | None) -> None:
            if self.stopping:
                log.warning("second signal: exiting now")
                raise SystemExit(1)
            log.info("signal %s: finishing the step in flight, then stopping", signum)
            self.stopping = True

        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)

    def _stopped(self) -> None:
        if self.worker is None:
            return
        try:
            with transaction.atomic():
                Worker.objects.filter(pk=self.worker.pk).update(state=WorkerState.STOPPED)
                journal.record(EventKind.WORKER_STOPPED, actor=self.actor)
        except DatabaseError:
            log.exception("could not record that %s stopped", self.worker)

    def _heartbeat(self) -> None:
        """Its own thread and connection: last_seen, and the live tick's lease, renewed."""
        try:
            while not self._beat_stop.wait(settings.LOOP_HEARTBEAT_SECONDS):
                self.beat()
        finally:
            connections.close_all()

    def beat(self) -> None:
        assert self.worker is not None
        with self._lock:
            current, since = self.current, self.current_since
        try:
            fields: dict[str, object] = {"last_seen": timezone.now()}
            if self.unrecorded_error:
                fields.update(last_error=self.unrecorded_error, last_error_at=timezone.now())
            Worker.objects.filter(pk=self.worker.pk).update(**fields)
            self.unrecorded_error = ""
            if current and time.monotonic() - since < settings.LOOP_STEP_TIMEOUT:
                renewed = lease.renew(current.task_id, self.worker.pk, current.epoch)
                with self._lock:
                    still_running = self.current is current  # not just committed and released
                if not renewed and still_running:
                    log.warning("task %s: lease moved on while its step ran", current.task_id)
        except DatabaseError as exc:
            log.error("heartbeat write failed: %s", exc)

    # ---- the tick ----------------------------------------------------------------------------

    def tick(self) -> bool:
        """One pass: claim a task, run its first open step, commit the verdict. While the
        verdict is `done` and the task runs on, the same commit starts its next step under
        the same lease, so a task's steps follow each other without a fresh claim. True if
        it found work."""
        if not self._space_ok():
            return False
        started = None
        try:
            # A cheap read first, so an idle worker does not take the write lock every poll.
            if not self._found_work and not Task.objects.running().filter(lease_free_q()).exists():
                return False
            with transaction.atomic():
                claimed = lease.claim(self.worker_id)
                if claimed is None:
                    self._found_work = False
                    return False
                begun = self._begin(*claimed)
            self._found_work = True
            while begun is not None:
                if isinstance(begun, NeedsProbe):
                    begun = self._probe_then_begin(begun)
                    continue
                started = begun
                with self._lock:
                    self.current, self.current_since = started, time.monotonic()
                holder = effects.Holder(self.worker_id, started.epoch, self.actor)
                verdict = tool_judge.run(started.step, holder)
                after = self._commit(started, verdict, chain=not self.once)
                begun = None if isinstance(after, Late) else after
            return True
        except DatabaseError as exc:
            self._write_failed(exc, started)
            raise
        except lease.LeaseLost as exc:
            log.warning("%s", exc)
            return True
        finally:
            self.in_hand = ""
            with self._lock:
                self.current = None

    @property
    def worker_id(self) -> int:
        assert self.worker is not None
        return self.worker.pk

    def _begin(
        self, task_id: int, epoch: int, probed: bool = False, task: Task | None = None
    ) -> Started | NeedsProbe | None:
        """Inside the claim's (or the previous verdict's) transaction: guard the first open
        step and start it, or record why not (a question, the attempt cap, a wait) and let
        the lease go. `task` is the row if the caller already read it in this transaction."""
        if task is None:  # a fresh claim (not a chained start)
            self._claimed_at = time.monotonic()
            task = rows.load(Task, "id = %s", [task_id])
            assert task is not None
        # Step.objects.open().first(), in plan order (index step_position_unique).
        step = rows.load(
            Step,
            "task_id = %s AND state NOT IN (%s, %s)",
            [task.pk, StepState.DONE, StepState.FAILED],
            order="position",
        )
        self.in_hand = f"task {task_id} step '{step.key}'" if step else f"task {task_id}"
        if step is None or step.state == StepState.BLOCKED:
            actions.follow(task, actor=self.actor)
            lease.release(task)
            return None
        # A read-only step never has effects: the judge refuses side-effect tools for it.
        step_effects = list(step.effects.all()) if step.side_effect else []
        now = timezone.now()
        for effect in step_effects:
            if effect.state == EffectState.RUNNING and not _live(effect, now):
                effects.doubt(
                    effect, actor=self.actor, why="its claim lapsed before the outcome was recorded"
                )
        tool = tools.get(step.tool)
        facts = guard.StepFacts(
            state=step.state,
            side_effect=step.side_effect,
            confirm_before=step.confirm_before,
            attempts=step.attempts,
            max_attempts=step.max_attempts,
            retry_recorded=step.retry_at is not None,
            authorized=bool(step.authorized_by),
            repeatable=tool.safe_to_repeat,
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
            if not probed and any(tools.get(e.tool).probe and not e.evidence for e in uncertain):
                return NeedsProbe(task_id, epoch, uncertain)  # keep the lease; ask the world
            self._ask(step, *questions.did_it_happen(uncertain))
        elif decision in (guard.Decision.ASK_MAY_I, guard.Decision.ASK_MAY_I_UNSENT):
            target, summary = _describe(step, tool)
            unsent = decision is guard.Decision.ASK_MAY_I_UNSENT
            self._ask(step, *questions.may_i(tool.name, target, summary, unsent=unsent))
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
            effects.probe_and_settle(effect, tools.get(effect.tool), actor=self.actor)
        with transaction.atomic():
            lease.fenced(need.task_id, self.worker_id, need.epoch)
            begun = self._begin(need.task_id, need.epoch, probed=True)
        assert not isinstance(begun, NeedsProbe)
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
        epoch. A late verdict is journaled as `late_result` and changes nothing."""
        return self._commit(started, verdict, chain=False) is not LATE

    def _commit(
        self, started: Started, verdict: Verdict, *, chain: bool
    ) -> Started | NeedsProbe | None | Late:
        """`commit`, and with `chain` the start of the task's next step in the same
        transaction (what the next tick would do, minus a claim and a commit), while the
        verdict was `done`, the task is still running and this worker may take work."""
        with transaction.atomic():
            try:
                task = lease.fenced(started.task_id, self.worker_id, started.epoch)
            except lease.LeaseLost as exc:
                journal.record(
                    EventKind.LATE_RESULT,
                    step=started.step,
                    actor=self.actor,
                    verdict=verdict.kind,
                    reason=str(exc),
                )
                log.warning("late verdict for %s refused: %s", started.step, exc)
                return LATE
            # The row as our start wrote it: only this lease holder changes a running step,
            # and every transition compares the state it expects.
            step = started.step
            if chain and self._may_continue(task, verdict):
                # The next step's guard and start decide the task's fate: follow() would see
                # a running task whose first open step is not blocked, and change nothing.
                self._apply(task, step, verdict, follow=False)
                return self._begin(task.pk, started.epoch, task=task)
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
            and not low_disk_reason()
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

    # ---- disk and write failures ---------------------------------------------------------

    def _space_ok(self) -> bool:
        reason = low_disk_reason()
        if reason != self.parked_reason:
            self._set_parked(reason)
        return not reason

    def _set_parked(self, reason: str) -> None:
        self.parked_reason = reason
        if reason:
            log.error("%s parked: %s", self.worker, reason)
        else:
            log.info("%s unparked", self.worker)
        try:
            with transaction.atomic():
                Worker.objects.filter(pk=self.worker_id).update(
                    state=WorkerState.PARKED if reason else WorkerState.RUNNING,
                    parked_reason=reason,
                )
                journal.record(EventKind.WORKER_PARKED, actor=self.actor, reason=reason)
        except DatabaseError as exc:
            log.error("could not record parking of %s: %s", self.worker, exc)

    def _write_failed(self, exc: DatabaseError, started: Started | None) -> None:
        if started:
            where = f"task {started.task_id} step '{started.step.key}'"
        else:
            where = self.in_hand or "claiming a task"
        message = f"write failed in {where}: {type(exc).__name__}: {exc}"
        log.error(message)
        self.unrecorded_error = message


def _live(effect: Effect, now: datetime) -> bool:
    return effect.state == EffectState.RUNNING and bool(
        effect.lease_until and effect.lease_until > now
    )


def _describe(step: Step, tool: tools.Tool) -> tuple[str, str]:
    try:
        outputs = dict(step.task.steps.filter(state=StepState.DONE).values_list("key", "output"))
        from .plans import resolve

        return tool.summary(resolve(step.args, outputs))
    except tools.ToolError:
        return tool.summary(step.args)


def lease_free_q():  # type: ignore[no-untyped-def]
    from django.db.models import Q

    now = timezone.now()
    return (Q(lease_until__isnull=True) | Q(lease_until__lt=now)) & (
        Q(run_after__isnull=True) | Q(run_after__lte=now)
    )
