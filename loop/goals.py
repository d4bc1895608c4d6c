"""A task from a goal in words (DESIGN.md §12, "Pippa plans, too"): the plan it starts with
(one planning step that the model judge performs), and where a goal's task stands while Pippa
plans it. `actions.create_task_from_goal` creates it; `actions.follow` moves it on when the
planning step ends.

And proposals (DESIGN.md §5, "Who wrote it"): steps written by Pippa or an agent — a plan, a
goal's plan, a revision by `add_steps` — wait for a person's approval when LOOP_CONFIRM_PLANS
says so (`needs_approval`): they are written `proposed`, and their task waits, paused, until a
person approves (`actions.approve_plan`: each side-effect call authorized as shown) or declines
(`actions.decline_plan`). Whatever the setting said, a side-effect step that no person wrote
never starts its first run unless a person's answer covers its exact call (`unasked`, the
guard's floor), except under `never`.

Nothing here writes.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

from . import plans
from .models import PERSON_WRITERS, Event, EventKind, Step, Task, TaskState, Writer

GOAL_CHARS = 4000  # a goal is words for the model, not a document
PLAN_KEY = "plan"  # the planning step's key: no step the model adds may take it
WAITING = "waiting for Dad to approve the plan"
CHANGED = "the plan changed: waiting for Dad to approve what was added"
APPROVED = "plan approved"
DECLINED = "plan declined"
NO_PLAN = "Pippa wrote no plan"

# The planning step's instructions, shown verbatim in its briefing (after the goal, and
# before the tools a plan may use, which `judges.prompt.briefing` lists as they are now).
PLANNING = """\
Write the plan for the goal above; do not carry the goal out yourself in this step.
Call add_steps with every step the goal needs, in order: once add_steps takes them, the plan \
is written and this step is done. Each step is an object, one of:
- a tool step: {"key", "title", "tool": a tool's name as listed below (e.g. "email.send"), \
"args": {its arguments}, "side_effect": true if the tool has side effects}. An argument may \
use an earlier step's output: "${key}" or "${key.field}".
- a model step, for work that needs judgement: {"key", "title", "judge": "model", \
"instructions": what to do, in words, "tools": [the tools it may use, by name], \
"side_effect": true if it lists a tool with side effects}.
Keys are letters, digits, '_', '-' or '.', each used once (not "plan"). If add_steps answers \
with an error, correct the steps and call add_steps again. If the goal can't be planned, \
commit_step 'failed' with the reason; to ask Dad something first, 'blocked' with your question."""


def plan_for(goal: Any, *, title: Any = None) -> plans.PlanSpec:
    """The plan a goal's task starts with: the goal as the task's `instructions`, and one
    step, the planning step (`judge: model`, read-only, the read-only built-ins as its tools).
    PlanError naming `goal` or `title`, or LOOP_LLM_BASE_URL when no model is configured."""
    errors = []
    if not isinstance(goal, str) or not goal.strip():
        errors.append("goal: required, the task's goal in words (a non-empty string)")
    elif len(goal) > GOAL_CHARS:
        errors.append(f"goal: at most {GOAL_CHARS} characters")
    elif problem := plans.check_value(goal, "goal"):
        errors.append(problem)
    if title is not None and (not isinstance(title, str) or not title.strip()):
        errors.append("title: a non-empty string, or left out (the goal's start)")
    elif isinstance(title, str) and len(title) > 200:
        errors.append("title: at most 200 characters")
    if not settings.LOOP_LLM_BASE_URL:
        errors.append("goal: Pippa plans with a model: LOOP_LLM_BASE_URL is not set")
    if errors:
        raise plans.PlanError(errors)
    words = str(goal).strip()
    return plans.validate(
        {
            "title": (title or "").strip() or short(words, 80),
            "instructions": words,
            "steps": [
                {
                    "key": PLAN_KEY,
                    "title": f"Plan: {short(words, 80)}",
                    "judge": "model",
                    "instructions": PLANNING,
                }
            ],
        }
    )


def short(text: str, limit: int) -> str:
    """The first line of `text`, within `limit` characters (an ellipsis says it was cut)."""
    line = text.strip().splitlines()[0].strip() if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 1].rstrip() + "…"


def came_from_planning(task: Task) -> bool:
    """Whether the task's latest move left `planning`: paused so (`propose`), it waits for
    Dad's approval of its plan; blocked so, its planning step asks Dad a question. Read from
    the journal's latest `task_state` event of the task (index event_task), committed: not
    for a move made earlier in the same `journal.batched()` block."""
    latest = (
        Event.objects.filter(task_id=task.pk, kind=EventKind.TASK_STATE)
        .order_by("-id")
        .values_list("data", flat=True)
        .first()
    )
    return isinstance(latest, dict) and latest.get("old") == TaskState.PLANNING


def needs_approval(writer: str, steps: list[plans.StepSpec]) -> bool:
    """Whether steps written by `writer` wait for a person's approval (LOOP_CONFIRM_PLANS):
    never a person's; Pippa's and an agent's when they hold a side effect (`side_effects`),
    always (`always`), or never (`never`)."""
    if writer in PERSON_WRITERS or not steps:
        return False
    mode = settings.LOOP_CONFIRM_PLANS
    return mode == "always" or (mode == "side_effects" and any(s.side_effect for s in steps))


def unasked(step: Step) -> bool:
    """The floor (DESIGN.md §5): a side-effect step no person wrote, whose calls need a
    person's answer covering each exactly (unless LOOP_CONFIRM_PLANS is `never`)."""
    return (
        step.side_effect
        and step.writer not in PERSON_WRITERS
        and settings.LOOP_CONFIRM_PLANS != "never"
    )


def proposal(task: Task) -> list[Step]:
    """The task's steps waiting for a person's approval, in plan order (index step_proposed)."""
    return list(Step.objects.filter(task_id=task.pk, proposed=True).order_by("position"))


def waits_for_approval(task: Task) -> bool:
    """Paused with a proposal by Pippa or an agent waiting for a person's approval."""
    return (
        task.state == TaskState.PAUSED
        and Step.objects.filter(task_id=task.pk, proposed=True).exists()
    )


def proposer(steps: list[Step]) -> str:
    """Who proposed these steps, as Dad reads it ("Pippa", "agent 'kidbot'")."""
    names = sorted(
        {"Pippa" if s.writer == Writer.PIPPA else f"agent '{s.written_by}'" for s in steps}
    )
    return " and ".join(names) or "nobody"


def planning(task: Task) -> bool:
    """Pippa is still planning it: `planning`, or blocked by its planning step's question."""
    return task.state == TaskState.PLANNING or (
        task.state == TaskState.BLOCKED and came_from_planning(task)
    )
