"""Who may do what. Every act a person or an agent asks for needs the Django permissions in
`NEEDS`; the action in `loop/actions.py` checks them itself, so the dashboard, the admin, the
API and the commands share one rule. An agent acts with its token's user's permissions. The
loop itself and the operator's management commands act as `SYSTEM`, which may do everything.

A refusal is journaled (`decision_refused`, naming the act and the missing permissions) in its
own transaction, and raises `Forbidden`, a PermissionDenied.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AbstractUser, AnonymousUser
from django.core.exceptions import PermissionDenied
from django.db import transaction

from . import journal
from .models import EventKind, Step, Task

ANSWER = "loop.confirm_step"  # Dad's: answer "May I do this?" / "Did this happen?"
STEER = ANSWER  # pausing, resuming, re-planning someone's task is Dad's too
CREATE = "loop.add_task"
DRIVE = "loop.change_step"  # run a step yourself: next, renew, effects, commit, release
WRITE = "loop.add_message"  # write in the conversation (it ends a schedule's standing pass)

NEEDS: dict[str, tuple[str, ...]] = {
    "create a task": (CREATE,),
    "answer questions": (ANSWER,),
    "pause": (STEER,),
    "resume": (STEER,),
    "approve a plan": (STEER,),  # LOOP_CONFIRM_PLANS: Pippa's plan runs once Dad approves it
    "add steps": (STEER,),
    "edit steps": (STEER,),
    "supersede": (STEER, CREATE),  # it creates the successor
    "drive a step": (DRIVE,),
    # A schedule's runs make tasks whose "May I do this?" is answered in advance (DESIGN.md
    # §10): making one is creating tasks and answering for them.
    "create a schedule": (CREATE, ANSWER),
    "edit a schedule": (CREATE, ANSWER),  # its plan, its times, switching it on or off
    "write in the conversation": (WRITE,),
}


class System:
    """The loop itself and the operator at the shell (management commands)."""

    def __repr__(self) -> str:
        return "SYSTEM"


SYSTEM = System()
Who = AbstractUser | AnonymousUser | System


class Forbidden(PermissionDenied):
    """`act` needs the permissions in `missing`; nothing was changed."""

    def __init__(self, act: str, missing: list[str]) -> None:
        super().__init__(f"you may not {act} ({', '.join(missing)})")
        self.act = act
        self.missing = missing


def missing(who: Who, act: str) -> list[str]:
    if isinstance(who, System):
        return []
    return [perm for perm in NEEDS[act] if not who.has_perm(perm)]


def may(who: Who, act: str) -> bool:
    return not missing(who, act)


def require(
    who: Who,
    act: str,
    *,
    actor: str,
    task_id: int | None = None,
    step_id: int | None = None,
    **data: Any,
) -> None:
    """Return if `who` may `act`; else journal the refusal and raise Forbidden. Commits the
    refusal's event on its own (or in the caller's transaction, which must then commit)."""
    lacking = missing(who, act)
    if not lacking:
        return
    with transaction.atomic():
        step = Step.objects.filter(pk=step_id).first() if step_id is not None else None
        task = Task.objects.filter(pk=task_id).first() if task_id is not None else None
        journal.record(
            EventKind.DECISION_REFUSED,
            task=task,
            step=step,
            actor=actor,
            action=act,
            reason=f"missing permission {', '.join(lacking)}",
            **data,
        )
    raise Forbidden(act, lacking)
