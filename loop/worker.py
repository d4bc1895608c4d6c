"""The worker process (DESIGN.md §4, §8, §11): registers after boot reconciliation, ticks,
heartbeats and renews the live steps' leases, parks on low disk, drains on the first signal,
and decides what goes into a batch (its batch policy).

tick = claim + guard + start, for a batch of tasks  (one commit)
     → perform each step through its judge (the side-effect steps' calls share the outbox's
       commits)
     → the verdicts, each fenced on its lease epoch (one commit, which also starts next steps)

The step's life itself — guard and start, perform, fenced commit — is `loop.step_life`, plain
functions that the API's agents call too.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from types import FrameType
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connections, transaction

from . import actions, clock, effects, journal, lease, llm, prune, schedules, sql, step_life
from .boot import host_name, proc_start_time, reconcile, this_machine
from .health import low_disk_reason
from .judges import Verdict
from .mcp import catalog
from .models import EventKind, WorkerState
from .models import Worker as WorkerRow
from .notify.notifier import Notifier
from .step_life import ASKING_AT_ONCE, Begun, NeedsProbe, Room, Started

log = logging.getLogger("loop.worker")


class TickFailed(DatabaseError):
    """A write of the tick failed; the message says where (task and step) and why."""


def drop_broken_connections() -> None:
    """Between ticks (and beats): close this thread's database connections that failed and no
    longer answer (a restarted server), or that were left inside a transaction, so the next
    tick connects afresh; a healthy one is kept. Django's `close_old_connections` would also close
    every connection older than CONN_MAX_AGE, which for PostgreSQL is 0 (a web request's): a
    new server process, forked and authenticated, for every tick and every idle poll."""
    for conn in connections.all(initialized_only=True):
        if conn.connection is None:
            continue
        if conn.get_autocommit() != conn.settings_dict["AUTOCOMMIT"]:
            conn.close()
        elif conn.errors_occurred:
            if conn.is_usable():
                conn.errors_occurred = False
            else:
                conn.close()


class Worker:
    """One `runloop` process."""

    def __init__(self, *, label: str = "", once: bool = False, batch: int | None = None) -> None:
        self.label = label
        self.once = once
        self.batch_size = 1 if once else (batch or settings.LOOP_BATCH)
        self.effects_size = min(self.batch_size, settings.LOOP_BATCH_EFFECTS)
        self.worker: WorkerRow | None = None
        self.stopping = False
        self.parked_reason = ""
        self.unrecorded_error = ""
        self.in_flight: list[Started] = []  # the batch's steps, whose leases the beat renews
        self.in_flight_since = 0.0
        self._found_work = False
        self._schedules_polled = -schedules.POLL_SECONDS
        self._lock = threading.Lock()
        self._beat_stop = threading.Event()
        self._declared_dead = False  # set by the heartbeat thread, handled by the main loop
        # The worker row's last_error: recorded by a beat, cleared by the first beat after a
        # write worked again (a tick that did not fail), so /healthz stops saying it.
        self._error_recorded = False
        self._wrote_since_error = False
        self._skew_said = False
        # When this worker's own link to the database last came up (a beat that worked after
        # none, or after one that failed): until it has held for LOOP_WORKER_DEAD_AFTER, a
        # peer's stale heartbeat may be the same outage this worker just had (a database
        # restart stops every beat alike), so the reap judges by process tables only.
        self._link_since: float | None = None
        # Set when a reap freed some work: an idle main loop looks for it at once.
        self._wake = threading.Event()

    @property
    def actor(self) -> str:
        assert self.worker is not None
        return f"worker:{self.worker.pk}"

    @property
    def worker_id(self) -> int:
        assert self.worker is not None
        return self.worker.pk

    def holding(self, epoch: int) -> effects.Holder:
        """This worker as the holder of a task's lease at `epoch`."""
        return effects.Holder(self.worker_id, epoch, self.actor)

    # ---- life cycle ------------------------------------------------------------------------

    def boot(self) -> dict[str, int]:
        """Retire dead owners' effects first, then register this incarnation."""
        counts = reconcile(actor=f"boot:{host_name()}:{os.getpid()}")
        self._register(reconciled=counts)
        if settings.LOOP_MCP_SERVERS:
            catalog.discover_all()  # sessions opened now, kept; a server down only logs
        log.info("%s started (reconciled %s)", self.worker, counts)
        return counts

    def _register(self, **data: Any) -> None:
        """A new incarnation: its own Worker row, with the machine whose process table holds
        its pid, and its first heartbeat by the database's clock; journaled."""
        machine = this_machine()
        with transaction.atomic():
            self.worker = WorkerRow.objects.create(
                label=self.label,
                host=machine.host,
                boot_id=machine.boot_id,
                pid_ns=machine.pid_ns,
                pid=os.getpid(),
                pid_started=proc_start_time(os.getpid()),
                started_at=clock.db_now(),
                last_seen=clock.db_now(),
            )
            self.worker.refresh_from_db(fields=["started_at", "last_seen"])
            journal.record(EventKind.WORKER_STARTED, actor=self.actor, label=self.label, **data)
        if self._link_since is None:
            self._link_since = time.monotonic()  # the link held for this write: it is up

    def _reborn(self) -> None:
        """A peer found this worker dead (its heartbeat was stale) and settled its work: the
        old incarnation's commits are refused by the fence. Go on as a new incarnation."""
        old = self.worker_id
        self._declared_dead = False
        self._register(declared_dead=old)
        log.warning("worker %s was found dead by a peer; going on as %s", old, self.worker)

    def run(self) -> str:
        """Boot, then tick until signalled (`once`: one tick). The error of the last tick if it
        failed, else "": `runloop --once` exits non-zero with it."""
        self.boot()
        self._install_signals()
        beat = threading.Thread(target=self._heartbeat, name="heartbeat", daemon=True)
        beat.start()
        # Dad is told (loop/notify): a thread of its own, never on a tick's path.
        notifier = (
            Notifier(worker=lambda: self.worker_id)
            if settings.LOOP_NOTIFY and not self.once
            else None
        )
        if notifier is not None:
            notifier.start()
        failures = 0
        failed = ""
        try:
            while not self.stopping:
                drop_broken_connections()
                if self._declared_dead:
                    self._reborn()
                try:
                    fired = self.fire_schedules()
                    found = self.tick() or fired
                    failures, failed = 0, ""
                except DatabaseError as exc:  # already logged and kept for the worker's row
                    failures += 1
                    found = False
                    failed = str(exc)
                except Exception as exc:  # a bug must not kill the worker: say it, back off
                    log.exception("tick failed")
                    failed = f"tick failed: {type(exc).__name__}: {exc}"
                    self.unrecorded_error = failed
                    failures += 1
                    found = False
                if self.once:
                    break
                if not found and not self.stopping:
                    delay = settings.LOOP_IDLE_SLEEP_MS / 1000
                    self._wake.wait(min(delay * (2**failures), 10.0) if failures else delay)
                    self._wake.clear()
        finally:
            self._beat_stop.set()
            if notifier is not None:
                notifier.close()
            beat.join(timeout=5)
            self._stopped()
            catalog.close_sessions()  # the MCP servers it started end with it
        return failed

    def fire_schedules(self) -> bool:
        """Fire the schedules due now (at most every `schedules.POLL_SECONDS`); True if this
        worker fired one. The slot's claim makes this safe in any number of workers."""
        now = time.monotonic()
        if self.parked_reason:
            return False  # parked: no new work, and a run's task is new work
        if now - self._schedules_polled < schedules.POLL_SECONDS and not self.once:
            return False
        self._schedules_polled = now
        try:
            with step_life.writing("firing due schedules"):
                return bool(schedules.fire_due(actor=self.actor))
        except DatabaseError as exc:
            self._write_failed(exc, [])
            raise

    def _install_signals(self) -> None:
        def handle(signum: int, frame: FrameType | None) -> None:
            if self.stopping:
                log.warning("second signal: exiting now")
                raise SystemExit(1)
            log.info("signal %s: finishing the steps in flight, then stopping", signum)
            self.stopping = True

        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)

    def _stopped(self) -> None:
        if self.worker is None:
            return
        try:
            with transaction.atomic():
                WorkerRow.objects.filter(pk=self.worker.pk).update(state=WorkerState.STOPPED)
                journal.record(EventKind.WORKER_STOPPED, actor=self.actor)
        except DatabaseError:
            log.exception("could not record that %s stopped", self.worker)

    def _heartbeat(self) -> None:
        """Its own thread and connection: last_seen, and the live tick's lease, renewed every
        LOOP_HEARTBEAT_SECONDS; dead peers looked for every LOOP_REAP_SECONDS (one read of
        the live workers' rows; a write only when one is dead)."""
        every = settings.LOOP_HEARTBEAT_SECONDS
        reap_every = min(settings.LOOP_REAP_SECONDS, every)
        next_beat = time.monotonic() + every
        next_prune = time.monotonic() + settings.LOOP_PRUNE_EVERY_SECONDS
        try:
            while not self._beat_stop.wait(reap_every):
                # This thread's own connection: one the server dropped (a restart, a
                # failover) would fail every beat after, and peers would take this live
                # worker for dead and settle its work.
                drop_broken_connections()
                if time.monotonic() >= next_beat:
                    self.beat()
                    self.withdraw_moot()
                    next_beat = time.monotonic() + every
                self.reap()
                if settings.LOOP_PRUNE_AFTER_DAYS and time.monotonic() >= next_prune:
                    self.prune_some()
                    next_prune = time.monotonic() + settings.LOOP_PRUNE_EVERY_SECONDS
        finally:
            connections.close_all()

    def reap(self) -> dict[str, int]:
        """Settle dead peers' work now (§9), so their tasks are claimed again at once rather
        than when their leases run out. The fence stays the last word."""
        since = self._link_since
        steady = since is not None and (time.monotonic() - since >= settings.LOOP_WORKER_DEAD_AFTER)
        try:
            counts = reconcile(actor=self.actor, exclude=self.worker_id, by_heartbeat=steady)
        except DatabaseError as exc:
            self._link_since = None
            log.error("looking for dead workers failed: %s", exc)
            return {}
        except Exception:  # a bug must not stop the heartbeat: say it, go on
            log.exception("looking for dead workers failed")
            return {}
        if counts["workers"]:
            log.warning("%s settled dead workers: %s", self.worker, counts)
            self._wake.set()
        return counts

    def withdraw_moot(self) -> int:
        """Questions the world answered since they were asked, withdrawn (a late report)."""
        try:
            withdrawn = actions.withdraw_moot_questions(actor=self.actor)
        except DatabaseError as exc:
            log.error("looking for questions answered since failed: %s", exc)
            return 0
        except Exception:  # a bug must not stop the heartbeat: say it, go on
            log.exception("looking for questions answered since failed")
            return 0
        if withdrawn:
            log.info("%s withdrew %d question(s) a late report answered", self.worker, withdrawn)
            self._wake.set()
        return withdrawn

    def prune_some(self) -> int:
        """One small batch of old history gone (LOOP_PRUNE_AFTER_DAYS): never on a tick's path."""
        try:
            window = prune.Window.of(settings.LOOP_PRUNE_AFTER_DAYS)
            return sum(prune.prune(window, max_batches=1).values())
        except DatabaseError as exc:
            log.error("pruning failed: %s", exc)
            return 0
        except Exception:  # a bug must not stop the heartbeat: say it, go on
            log.exception("pruning failed")
            return 0

    def beat(self) -> None:
        """last_seen, by the database's clock, which measures this host's (loop/clock.py): a
        skew past LOOP_CLOCK_SKEW_SECONDS is logged when it appears and when it is gone. The
        error to record, or the one to clear once a write has worked since; then the live
        steps' leases."""
        assert self.worker is not None
        with self._lock:
            flying, since = list(self.in_flight), self.in_flight_since
        try:
            error = self.unrecorded_error
            if error:
                recording: str | None = error
            else:
                recording = "" if self._error_recorded and self._wrote_since_error else None
            sent = time.time()
            written = sql.beat(self.worker.pk, sent=sent, error=recording)
            if written is None:
                self._declared_dead = True
                return
            if self._link_since is None:
                self._link_since = time.monotonic()
            self._note_skew(clock.note(written, sent, time.time()))
            if error and self.unrecorded_error == error:
                self.unrecorded_error = ""  # recorded; a newer one waits for the next beat
                self._error_recorded, self._wrote_since_error = True, False
            elif recording == "":
                self._error_recorded = False
            for started in flying if time.monotonic() - since < settings.LOOP_STEP_TIMEOUT else []:
                renewed = lease.renew(started.task_id, self.worker.pk, started.epoch)
                with self._lock:
                    # not just committed and released
                    still_running = any(s is started for s in self.in_flight)
                if not renewed and still_running:
                    log.warning("task %s: lease moved on while its step ran", started.task_id)
        except DatabaseError as exc:
            self._link_since = None
            log.error("heartbeat write failed: %s", exc)

    def _note_skew(self, skew: float) -> None:
        """Say so when this host's skew crosses the setting (one line each way, not one per
        beat)."""
        if not clock.on_server():
            skew = 0.0  # one host: its clock is the database's
        off = abs(skew) > settings.LOOP_CLOCK_SKEW_SECONDS
        if off and not self._skew_said:
            log.warning(
                "%s: this host's clock is %s (LOOP_CLOCK_SKEW_SECONDS=%s); leases and "
                "heartbeats use the database's clock, but fix the host's (NTP)",
                self.worker,
                clock.described(skew),
                settings.LOOP_CLOCK_SKEW_SECONDS,
            )
        elif not off and self._skew_said:
            log.info(
                "%s: this host's clock is back within %s s of the database's",
                self.worker,
                settings.LOOP_CLOCK_SKEW_SECONDS,
            )
        self._skew_said = off

    # ---- the tick and the batch policy -------------------------------------------------------

    def tick(self) -> bool:
        """One pass: claim a batch of tasks and start each one's first open step in one
        commit, run the steps, commit their verdicts in one commit. While a verdict is `done`
        and its task runs on, that commit starts the task's next step under the same lease,
        so the batch moves on without fresh claims. True if it found work. A pass that did
        not fail clears the write failure recorded before it (at the next beat)."""
        found = self._tick()
        self._wrote_since_error = True
        return found

    def _tick(self) -> bool:
        if not self._space_ok():
            return False
        batch: list[Started] = []
        try:
            # A cheap read first, so an idle worker does not take the write lock every poll.
            if not self._found_work and not lease.any_claimable():
                return False
            begun = self.claim_batch()
            self._found_work = bool(begun)
            if not begun:
                return False
            batch = self._probed(begun)
            while batch:
                with self._lock:
                    self.in_flight, self.in_flight_since = batch, time.monotonic()
                verdicts, waiting = self.perform(batch)
                batch = waiting + self._probed(self.commit_batch(verdicts, waiting))
            return True
        except DatabaseError as exc:
            raise TickFailed(self._write_failed(exc, batch)) from exc
        except lease.LeaseLost as exc:
            log.warning("%s", exc)
            return True
        finally:
            with self._lock:
                self.in_flight = []

    def claim_batch(self) -> list[Begun]:
        """In one transaction: claim up to `batch_size` tasks and begin each. Claims go in
        rounds of as many tasks as the batch has room for, and never more than it has room for
        side-effect steps (a task begins one step at most). A claimed task whose step would ask
        if cut, while the batch holds one such, is deferred; then claiming stops (the deferred
        task's lease is free again: another round could take it back). Stops too when no more
        tasks are free, or the batch is full. The planned calls' intents commit with it."""
        batch: list[Begun] = []
        claiming = True  # else the batch's journal and commit are what fails
        try:
            with transaction.atomic(), journal.batched():
                while True:
                    room = self.batch_size - len(batch)
                    room = min(room, self.effects_size - step_life.effect_steps(batch))
                    claiming = True
                    claimed = lease.claim_many(self.worker_id, room) if room > 0 else []
                    if not claimed:
                        break
                    claiming = False
                    begun = step_life.begin(
                        [(task_id, self.holding(epoch)) for task_id, epoch in claimed],
                        room=Room(asking=ASKING_AT_ONCE - step_life.asking_steps(batch)),
                    )
                    batch += [b for b in begun if isinstance(b, Started | NeedsProbe)]
                    if any(isinstance(b, step_life.Deferred) for b in begun):
                        break
                batch = step_life.plan_calls(batch)
                claiming = False
        except step_life.WriteFailed:
            raise
        except DatabaseError as exc:
            where = "claiming a task" if claiming or not batch else step_life.named(batch)
            raise step_life.WriteFailed(where, exc) from exc
        return batch

    def perform(self, batch: list[Started]) -> tuple[list[tuple[Started, Verdict]], list[Started]]:
        """The read-only steps through their judges in turn, then the side-effect steps
        together; the verdicts, and the steps not yet run. After `LOOP_CHAIN_SECONDS` the
        verdicts so far go to be committed before the rest run, so a slow step keeps no
        finished one waiting."""
        plain = [[s] for s in batch if not s.step.side_effect]
        effectful = [s for s in batch if s.step.side_effect]
        turns = plain + ([effectful] if effectful else [])  # the effects go in one turn, last
        began = time.monotonic()
        verdicts: list[tuple[Started, Verdict]] = []
        for n, turn in enumerate(turns):
            if verdicts and time.monotonic() - began > settings.LOOP_CHAIN_SECONDS:
                return verdicts, [started for later in turns[n:] for started in later]
            verdicts += step_life.perform(turn)
        return verdicts, []

    def commit_batch(
        self, verdicts: list[tuple[Started, Verdict]], waiting: list[Started]
    ) -> list[Begun]:
        """These verdicts in one commit, each `done` starting its task's next step in it
        while chaining is allowed (not `once`, not stopping, the disk has room, within
        LOOP_CHAIN_SECONDS of the claim) and the batch, with the steps still `waiting` to
        run, has room for it."""
        room = Room(
            effects=self.effects_size - step_life.effect_steps(waiting),
            asking=ASKING_AT_ONCE - step_life.asking_steps(waiting),
        )
        chain = not self.once and not self.stopping and not low_disk_reason()
        return step_life.commit(verdicts, chain=chain, room=room)

    def _probed(self, begun: list[Begun]) -> list[Started]:
        """The batch's steps to run: any step that needs the world looked at first is probed
        (after the commit that claimed it) and begun again."""
        batch = []
        for one in begun:
            if isinstance(one, NeedsProbe):
                again = step_life.probe_then_begin(one)
                if again is not None:
                    batch.append(again)
            else:
                batch.append(one)
        return batch

    def _space_ok(self) -> bool:
        reason = low_disk_reason() or llm.outage()
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
                WorkerRow.objects.filter(pk=self.worker_id).update(
                    state=WorkerState.PARKED if reason else WorkerState.RUNNING,
                    parked_reason=reason,
                )
                journal.record(EventKind.WORKER_PARKED, actor=self.actor, reason=reason)
        except DatabaseError as exc:
            log.error("could not record parking of %s: %s", self.worker, exc)

    def _write_failed(self, exc: DatabaseError, batch: list[Started]) -> str:
        if isinstance(exc, step_life.WriteFailed):
            where = exc.where
            exc = exc.__cause__ if isinstance(exc.__cause__, DatabaseError) else exc
        else:
            where = "claiming a task"
        flying = [f"task {s.task_id} step '{s.step.key}'" for s in batch]
        if len(flying) > 1:
            where = f"{where} (in flight: {', '.join(flying)})"
        message = f"write failed in {where}: {type(exc).__name__}: {exc}"
        log.error(message)
        self.unrecorded_error = message
        return message
