"""The worker (DESIGN.md §4, §8, §11): registers after boot reconciliation, ticks, heartbeats
and renews the live step's lease, parks on low disk, drains on the first signal.

tick = claim + guard + start  (one commit)
     → judge (effects commit on their own)
     → verdict, fenced on the lease epoch (one commit, which also starts the next step)

The transactions of a step's life are in `loop/tick.py`.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from types import FrameType

from django.conf import settings
from django.db import DatabaseError, close_old_connections, connections, transaction
from django.db.models import Q
from django.utils import timezone

from . import effects, journal, lease
from .boot import proc_start_time, reconcile
from .health import low_disk_reason
from .judges import tool as tool_judge
from .models import (
    EventKind,
    Task,
    Worker,
    WorkerState,
)
from .tick import Late, NeedsProbe, Started, StepLifecycle

log = logging.getLogger("loop.runner")


class Runner(StepLifecycle):
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
                except DatabaseError:  # already logged and kept for the worker's row
                    failures += 1
                    found = False
                except Exception as exc:  # a bug must not kill the worker: say it, back off
                    log.exception("tick failed")
                    self.unrecorded_error = f"tick failed: {type(exc).__name__}: {exc}"
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
            error = self.unrecorded_error
            if error:
                fields.update(last_error=error, last_error_at=timezone.now())
            Worker.objects.filter(pk=self.worker.pk).update(**fields)
            if error and self.unrecorded_error == error:
                self.unrecorded_error = ""  # recorded; a newer one waits for the next beat
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


def lease_free_q() -> Q:
    """Claimable now: the lease is free and any retry is due (the claim's own conditions)."""
    now = timezone.now()
    return (Q(lease_until__isnull=True) | Q(lease_until__lt=now)) & (
        Q(run_after__isnull=True) | Q(run_after__lte=now)
    )
