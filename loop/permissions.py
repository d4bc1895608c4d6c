"""Who may do what, and who wrote what (DESIGN.md §1, §5 "Who wrote it", §19).

Every act a person, an agent or Pippa asks for needs the Django permissions in `NEEDS`; the
action in `loop/actions.py` checks them itself, so the dashboard, the admin, the API and the
commands share one rule. Four kinds of asker (`Who`):

- a person (a Django user: the dashboard, the admin) — their permissions;
- `SYSTEM` — the loop itself, and the operator at the shell (management commands): a person;
- an `Agent` (an API token) — its token's user's permissions, except that it never answers
  for a person (`PERSON_ONLY`: questions, plan approvals, schedules) unless the token was made
  to (`agent_token --answers`, a person's own client), and it acts only on the tasks it
  drives (`Task.driver`: the ones it created or a person gave it);
- `Pippa` — the model, in one step of one task: she may propose steps for that task, nothing
  else. Authority comes from a person: Pippa and agents propose, Dad disposes.

A refusal is journaled (`decision_refused`, naming the act and why) in its own transaction,
and raises `Forbidden`, a PermissionDenied.

`author()` says who wrote what an asker writes (`Step.writer`, `written_by`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import AbstractUser, AnonymousUser
from django.core.exceptions import PermissionDenied
from django.db import transaction

from . import journal
from .models import AgentToken, EventKind, Step, Task, Writer

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
    "approve a plan": (STEER,),  # a plan or revision by Pippa or an agent (LOOP_CONFIRM_PLANS)
    "add steps": (STEER,),
    "edit steps": (STEER,),
    "retry a step": (STEER,),  # a failed step again, with a fresh attempt cap
    "skip a step": (STEER,),  # a failed step waived: the task runs on without it
    "supersede": (STEER, CREATE),  # it creates the successor
    "drive a step": (DRIVE,),
    "give a task": (STEER,),  # let an agent drive it
    # A schedule's runs make tasks whose "May I do this?" is answered in advance (DESIGN.md
    # §10): making one is creating tasks and answering for them.
    "create a schedule": (CREATE, ANSWER),
    "edit a schedule": (CREATE, ANSWER),  # its plan, its times, switching it on or off
    "write in the conversation": (WRITE,),
    # A task waiting, paused, for a person's approval (Pippa's, in a conversation turn).
    "propose a task": (CREATE,),
}

# Acts that are a person's answer, whatever permissions an agent's user holds: only a person
# (or a token made to answer for one) gives them.
PERSON_ONLY = frozenset(
    {
        "answer questions",
        "approve a plan",
        "give a task",
        "create a schedule",
        "edit a schedule",
        # More attempts at a call, side effects included: a person's to give.
        "retry a step",
    }
)
# What Pippa may ask for, in her own task: a proposal, never an answer.
PIPPA_MAY = frozenset({"add steps", "write in the conversation", "propose a task"})


class System:
    """The loop itself and the operator at the shell (management commands)."""

    def __repr__(self) -> str:
        return "SYSTEM"


SYSTEM = System()


@dataclass(frozen=True)
class Agent:
    """An outside agent, by its API token: its user's permissions, within its rules."""

    token: AgentToken

    @property
    def name(self) -> str:
        return self.token.name

    def has_perm(self, perm: str) -> bool:
        return self.token.user.has_perm(perm)


@dataclass(frozen=True)
class Pippa:
    """The model, in the step `step_key` (its attempt `attempt`) of task `task_id`."""

    task_id: int
    step_key: str
    attempt: int

    @property
    def name(self) -> str:
        return f"Pippa (step '{self.step_key}', attempt {self.attempt})"


Who = AbstractUser | AnonymousUser | System | Agent | Pippa


class Forbidden(PermissionDenied):
    """`act` needs what `missing` names (permissions, or a rule); nothing was changed."""

    def __init__(self, act: str, missing: list[str], rule: str = "") -> None:
        super().__init__(rule or f"you may not {act} ({', '.join(missing)})")
        self.act = act
        self.missing = missing
        self.rule = rule


def missing(who: Who, act: str) -> list[str]:
    """The permissions `who` lacks for `act` (a rule's refusal is `refused`'s)."""
    if isinstance(who, System | Pippa):  # Pippa's rule is `refused`'s
        return []
    return [perm for perm in NEEDS[act] if not who.has_perm(perm)]


def refused(who: Who, act: str, task: Task | None = None, task_id: int | None = None) -> str:
    """The rule that refuses `who` the act (on `task`, or the task `task_id` names), in words;
    "" if none does."""
    if isinstance(who, Pippa):
        if act not in PIPPA_MAY:
            return f"Pippa may not {act}: only a person may; she may propose steps for her task"
        named = task.pk if task is not None else task_id
        if named != who.task_id:
            return f"Pippa may {act} only in her own task ({who.task_id}), not task {named}"
        return ""
    if not isinstance(who, Agent):
        return ""
    if act in PERSON_ONLY and not who.token.answers:
        return (
            f"only a person may {act}: agent '{who.name}' is not one, whatever its user "
            "may do (a token made with `agent_token --answers` is a person's own client)"
        )
    if task is not None and not who.token.answers and task.driver != who.name:
        driver = f"agent '{task.driver}'" if task.driver else "no agent"
        return (
            f"task {task.pk} is not agent '{who.name}''s to {act}: an agent acts only on the "
            f"tasks it created or a person gave it (this one is {driver}'s)"
        )
    return ""


def may(who: Who, act: str) -> bool:
    return not missing(who, act) and not refused(who, act)


def require(
    who: Who,
    act: str,
    *,
    actor: str,
    task_id: int | None = None,
    step_id: int | None = None,
    **data: Any,
) -> None:
    """Return if `who` may `act` (on the task, or the step's task, named); else journal the
    refusal and raise Forbidden. Commits the refusal's event on its own (or in the caller's
    transaction, which must then commit)."""
    lacking = missing(who, act)
    step = task = None
    if isinstance(who, Agent | Pippa) and (task_id is not None or step_id is not None):
        step = Step.objects.filter(pk=step_id).first() if step_id is not None else None
        found = step.task_id if step is not None else task_id
        task = Task.objects.filter(pk=found).first() if found is not None else None
    rule = "" if lacking else refused(who, act, task, task_id)
    if not lacking and not rule:
        return
    with transaction.atomic():
        if step is None and step_id is not None:
            step = Step.objects.filter(pk=step_id).first()
        if task is None and task_id is not None:
            task = Task.objects.filter(pk=task_id).first()
        journal.record(
            EventKind.DECISION_REFUSED,
            task=task,
            step=step,
            actor=actor,
            action=act,
            reason=rule or f"missing permission {', '.join(lacking)}",
            **data,
        )
    raise Forbidden(act, lacking, rule)


def author(who: Who, actor: str) -> tuple[Writer, str]:
    """Who writes what `who` writes (as `actor`): the writer's kind and name. A schedule's
    runs say so themselves (`Writer.SCHEDULE`)."""
    if isinstance(who, Pippa):
        return Writer.PIPPA, who.name
    if isinstance(who, Agent):
        return Writer.AGENT, who.name
    if isinstance(who, System):
        return Writer.PERSON, actor
    return Writer.PERSON, who.get_username() or actor
