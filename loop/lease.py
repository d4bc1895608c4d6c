"""Leases (DESIGN.md §4, §8): claim in one statement, renew, fence.

`lease_epoch` is the fencing token: every claim bumps it, and every commit of a verdict or
claim of an effect checks that the task's epoch and owner are still the caller's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db import transaction

from . import clock, sql
from .models import AgentToken, Effect, EffectState, Task, Worker, WorkerState


class LeaseLost(Exception):
    """The task's lease moved on: this holder's commit is refused."""


class TaskGone(LeaseLost):
    """The task was deleted while its step ran."""


def claim(owner: int, *, seconds: int | None = None) -> tuple[int, int] | None:
    """Claim one runnable task whose lease is free: (task id, new epoch), or None."""
    claimed = claim_many(owner, 1, seconds=seconds)
    return claimed[0] if claimed else None


def any_claimable() -> bool:
    """Whether a claim would find a task now (a read: no lock taken)."""
    return sql.any_claimable()


def claim_many(owner: int, count: int, *, seconds: int | None = None) -> list[tuple[int, int]]:
    """Claim up to `count` claimable tasks (running or planning) in one statement
    (`sql.claim_free_tasks`); (task id, new epoch) of each, least-claimed first (every claim
    bumps the epoch), so a long task cannot starve the others. Its times are the database's
    (loop/clock.py)."""
    found = sql.claim_free_tasks(owner, count, seconds=seconds or settings.LOOP_LEASE_SECONDS)
    # In the order the subquery chose them (each epoch is one more than it was).
    return sorted(found, key=lambda claimed: (claimed[1], claimed[0]))


def claim_task(task_id: int, owner: int, *, seconds: int) -> int | None:
    """Claim this one task for `owner` (an API agent's `next`); returns the new epoch, or None
    if it is not running, its retry is not due, or someone else holds its lease. The owner
    may claim again a task it holds: the epoch moves on and its older lease token goes stale.
    """
    return sql.claim_one_task(task_id, owner, seconds=seconds)


def fenced(task_id: int, owner: int, epoch: int) -> Task:
    """The task, locked for this transaction, if `owner` still holds it at `epoch`; else
    LeaseLost (TaskGone if it was deleted)."""
    found = fenced_all(owner, [(task_id, epoch)])[task_id]
    if isinstance(found, LeaseLost):
        raise found
    return found


def fenced_all(owner: int, held: list[tuple[int, int]]) -> dict[int, Task | LeaseLost]:
    """`fenced` for several (task id, epoch) at once, with one statement: each task, or why
    its lease is no longer `owner`'s. Locks in id order, so two workers never deadlock."""
    tasks = sql.by_ids(Task, [task_id for task_id, _ in held], for_update=True)
    found = {task.pk: task for task in tasks}
    result: dict[int, Task | LeaseLost] = {}
    for task_id, epoch in held:
        task = found.get(task_id)
        if task is None:
            result[task_id] = TaskGone(f"task {task_id} is gone")
        elif not held_by(task, owner, epoch):
            result[task_id] = LeaseLost(
                f"task {task.pk}: lease is now epoch {task.lease_epoch} of owner "
                f"{task.lease_owner}, not epoch {epoch} of {owner}"
            )
        else:
            result[task_id] = task
    return result


def held_by(task: Task, owner: int, epoch: int) -> bool:
    """Whether `owner` holds the task's lease at `epoch`, as this row says."""
    return task.lease_owner == owner and task.lease_epoch == epoch


def renew(task_id: int, owner: int, epoch: int, *, seconds: int | None = None) -> bool:
    """Extend a held lease (and the claims of its running effects) to `seconds` from now by
    the database's clock. False if it moved on."""
    until = clock.db_now(seconds or settings.LOOP_LEASE_SECONDS)
    with transaction.atomic():
        count = Task.objects.filter(pk=task_id, lease_owner=owner, lease_epoch=epoch).update(
            lease_until=until
        )
        if count:
            Effect.objects.filter(
                task_id=task_id, state=EffectState.RUNNING, lease_owner=owner, lease_epoch=epoch
            ).update(lease_until=until)
    return count == 1


def let_go(task_id: int, owner: int) -> bool:
    """`owner` gives up its lease on the task, whatever its epoch (an API agent's `release`),
    inside the caller's transaction. False if it does not hold it."""
    count = Task.objects.filter(pk=task_id, lease_owner=owner).update(
        lease_owner=None, lease_until=None
    )
    return count == 1


def release(task: Task) -> None:
    """Give the lease up (inside the caller's fenced transaction). The epoch stays: the next
    claim bumps it."""
    release_all([task])


def release_all(tasks: list[Task]) -> None:
    """`release` of these tasks, with one statement (a batch's deferred tasks)."""
    if not tasks:
        return
    free = {"lease_owner": None, "lease_until": None}
    sql.update_many(Task, [free for _ in tasks], [{"id": task.pk} for task in tasks])
    for task in tasks:
        task.lease_owner = None
        task.lease_until = None


@dataclass(frozen=True)
class Holder:
    """Who holds a task's lease, as people read it: a worker (its label, or host:pid) or an
    API agent (its name), and until when."""

    kind: str  # "worker" | "agent"
    name: str
    until: datetime

    def __str__(self) -> str:
        return f"agent:{self.name}" if self.kind == "agent" else f"worker {self.name}"


def holders(
    tasks: Iterable[Task], *, now: datetime | None = None, shown: bool = False
) -> dict[int, Holder]:
    """The live holder of each of these tasks that has one (a lease not yet run out), with a
    statement for workers and one for agents. An agent's owner id is its token's negative pk.

    `shown` (what a page says): a worker found dead or stopped, or silent for longer than
    LOOP_WORKER_DEAD_AFTER, holds nothing worth naming, though its lease runs on until a peer
    settles it or it runs out."""
    now = now or clock.now()
    held = [t for t in tasks if t.lease_owner is not None and t.lease_until and t.lease_until > now]
    owners = {t.lease_owner for t in held}
    workers = {w.pk: w for w in Worker.objects.filter(pk__in=[o for o in owners if o and o > 0])}
    agents = {
        a.pk: a for a in AgentToken.objects.filter(pk__in=[-o for o in owners if o and o < 0])
    }
    found = {}
    for task in held:
        owner = task.lease_owner
        assert owner is not None and task.lease_until is not None
        if owner < 0:
            agent = agents.get(-owner)
            found[task.pk] = Holder("agent", agent.name if agent else str(-owner), task.lease_until)
        else:
            worker = workers.get(owner)
            if shown and worker is not None and not _alive(worker, now):
                continue
            name = (worker.label or f"{worker.host}:{worker.pid}") if worker else str(owner)
            found[task.pk] = Holder("worker", name, task.lease_until)
    return found


def _alive(worker: Worker, now: datetime) -> bool:
    if worker.state not in (WorkerState.RUNNING, WorkerState.PARKED):
        return False
    return (now - worker.last_seen).total_seconds() <= settings.LOOP_WORKER_DEAD_AFTER


def holder(task: Task, *, shown: bool = False) -> Holder | None:
    """`holders` of one task."""
    return holders([task], shown=shown).get(task.pk)
