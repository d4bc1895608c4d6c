"""Conversation turns (DESIGN.md §10, "Pippa reads and writes the conversation").

A message from Dad that no running task answers — no task with a model step is under way to
read it — starts a conversation turn in the same commit: a task of one read-only model step
(`reply`) whose requests carry the conversation like every model step's. Pippa answers with
`say`, and may propose a task with `propose_task`: a plan she writes, created with every step
`proposed` and the task waiting, paused, for Dad's one click (approve or decline, as any plan
she writes: `actions.approve_plan`, `actions.decline_plan`), shown as a card in the
conversation. The turn is a step like any other — durable transcript, bounds, crash-safe: its
`say` and its proposal each commit with their call's result, so a cut turn answers once.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import transaction

from . import actions, conversation, goals, journal, plans, schedules
from .models import (
    AuthorKind,
    EventKind,
    Message,
    Origin,
    Schedule,
    Step,
    StepState,
    Task,
    TaskState,
)
from .permissions import SYSTEM, Pippa, Who, require

TURN_KEY = "reply"
PROPOSE = "propose_task"
PROPOSE_SCHEDULE = "propose_schedule"
INSTRUCTIONS = """\
Dad wrote in the conversation (his latest message is shown above, with what came before). \
Answer him with the say tool: short, plain words. If he asks for something to be done, you may \
propose a task with propose_task: a title and its steps (plan-file steps, as below); it runs \
only when Dad approves it, so say what it will do. For something to do again and again, \
propose a schedule with propose_schedule: the same, with "schedule" (a cron expression) and \
"timezone". Do not carry it out yourself in this step. Then call commit_step 'done'."""

LIVE_TASKS = (TaskState.PLANNING, TaskState.RUNNING, TaskState.BLOCKED)
OPEN_STEPS = (StepState.PENDING, StepState.RUNNING, StepState.BLOCKED)


def answered() -> bool:
    """Whether a task under way will read a new message: one with a model step still to run
    (its next request carries the conversation). Index step_open serves it."""
    return Step.objects.filter(
        judge="model", state__in=OPEN_STEPS, task__state__in=LIVE_TASKS
    ).exists()


def post(*, author: str, text: str, user: Who) -> tuple[Message, Task | None]:
    """A person's message, and the conversation turn it starts when no task under way answers
    it and a model is configured: one commit. The turn's task, or None."""
    require(user, "write in the conversation", actor=author)  # a refusal's event commits
    with transaction.atomic():
        message = conversation.post(author=author, kind=AuthorKind.USER, text=text, user=user)
        if not settings.LOOP_LLM_BASE_URL or answered():
            return message, None
        plan = plans.validate(
            {
                "title": f"Reply to {author}: {goals.short(text, 60)}",
                "steps": [
                    {
                        "key": TURN_KEY,
                        "title": "Reply in the conversation",
                        "judge": "model",
                        "instructions": INSTRUCTIONS,
                    }
                ],
            }
        )
        task = actions.create_task(plan=plan, actor=author, user=SYSTEM, origin=Origin.CONVERSATION)
        Task.objects.filter(pk=task.pk).update(origin_message=message)
        task.origin_message = message
    return message, task


def is_turn(step: Step) -> bool:
    """The step is a conversation turn's reply (it may propose tasks)."""
    return step.key == TURN_KEY and step.task.origin == Origin.CONVERSATION


def propose(step: Step, args: dict[str, Any]) -> Task:
    """Pippa's proposal in a turn: a task from the plan `args` (`title`, `steps`, optional
    `instructions`), validated like any plan (PlanError naming the field), written by Pippa,
    every step `proposed`, the task paused until Dad approves; and her message carrying it as
    a card. In the caller's transaction (with the call's result)."""
    who = Pippa(step.task_id, step.key, step.attempts)
    spec = plans.validate(args)
    if spec.schedule is not None:
        raise plans.PlanError(["schedule: a proposal is a task; Dad writes schedules"])
    with transaction.atomic():
        task = actions.propose_task(plan=spec, actor=who.name, user=who)
        conversation.post(
            author="Pippa",
            kind=AuthorKind.PIPPA,
            text=f"I propose a task: {spec.title} ({len(spec.steps)} "
            f"step{'' if len(spec.steps) == 1 else 's'}). It runs when you approve it.",
            user=who,
            task_id=step.task_id,
            proposal=task,
        )
    return task


def propose_schedule(step: Step, args: dict[str, Any]) -> Message:
    """Pippa's proposal of a schedule in a turn: a plan with `schedule` (and `timezone`),
    validated like any (PlanError naming the field), kept with her message until Dad approves
    it — then it is created as his (`approve_schedule`) — or declines it. In the caller's
    transaction (with the call's result)."""
    who = Pippa(step.task_id, step.key, step.attempts)
    spec = plans.validate(args)
    if spec.schedule is None:
        raise plans.PlanError(["schedule: required (a cron expression); without one, propose_task"])
    return conversation.post(
        author="Pippa",
        kind=AuthorKind.PIPPA,
        text=f"I propose a schedule: {spec.title}, at '{spec.schedule}' ({spec.timezone}). "
        "It starts when you approve it.",
        user=who,
        task_id=step.task_id,
        schedule=args,
    )


def approve_schedule(*, message_id: int, actor: str, user: Who) -> Schedule:
    """A person approves the schedule Pippa proposed with message `message_id`: it is created
    as theirs (they may create schedules: `schedules.create` checks), and the message says so.
    Refused once it was answered."""
    with transaction.atomic():
        message = _unanswered(message_id)
        spec = plans.validate(message.proposed_schedule)
        schedule = schedules.create(spec=spec, actor=actor, user=user)
        Message.objects.filter(pk=message.pk).update(answer=f"approved by {actor}")
    return schedule


def decline_schedule(*, message_id: int, actor: str, user: Who) -> Message:
    """A person declines the schedule Pippa proposed: nothing is created; journaled."""
    require(user, "create a schedule", actor=actor)
    with transaction.atomic():
        message = _unanswered(message_id)
        Message.objects.filter(pk=message.pk).update(answer=f"declined by {actor}")
        journal.record(EventKind.PLAN_DECLINED, actor=actor, message=message.pk, schedule=True)
    return message


def _unanswered(message_id: int) -> Message:
    message = Message.objects.select_for_update().filter(pk=message_id).first()
    if message is None or message.proposed_schedule is None:
        raise actions.Refused(f"message {message_id} proposes no schedule")
    if message.answer:
        raise actions.Refused(f"message {message_id}'s schedule was {message.answer}")
    return message
