"""What the model judge shows the model (DESIGN.md §12): the system message, each attempt's
briefing (the task, the plan with states and outputs, the step's instructions verbatim), the
tools the step may use (names with `.` written `_`) and the two that end a step; and how long
texts are cut (LOOP_LLM_RESULT_CHARS, with a note: never silently)."""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings

from .. import tools, turns
from ..models import Event, EventKind, Step, TaskState

COMMIT = "commit_step"
ADD_STEPS = "add_steps"
SAY = "say"  # a message to Dad in the conversation (DESIGN.md §10), not a side effect
VERDICTS = ("done", "failed", "retry", "blocked")
REMINDER = (
    "You answered without calling a tool. To finish this step, call commit_step with a "
    "verdict (done, failed, retry or blocked) and the step's output."
)
SYSTEM_TEXT = (
    "You are Pippa, an assistant that carries out one step of a task at a time for Dad. "
    "Use the tools you are given to do the step. Every tool call gets its result. Side "
    "effects (mails, posts, writes) happen exactly once; if a result says one may have "
    "happened, believe it and do not try again. When the step is finished call commit_step: "
    "verdict 'done' with its output, 'failed' with the error, 'retry' to try again later, or "
    "'blocked' with a question for Dad. You may revise the plan with add_steps: once it takes "
    "the steps, this turn ends, and unless the same reply calls commit_step you go on with "
    "this step in its next attempt, shown the revised plan. Write to Dad with say. What Dad "
    "writes in the conversation and answers to your questions outranks the plan and the "
    "step's instructions."
)

# The plan in a briefing is cut at this many times LOOP_LLM_RESULT_CHARS.
PLAN_TIMES = 4


def model_name(tool_name: str) -> str:
    return tool_name.replace(".", "_")


def cut(text: str, limit: int | None = None) -> str:
    """`text` within LOOP_LLM_RESULT_CHARS, with a note of what was cut: never silently."""
    limit = int(settings.LOOP_LLM_RESULT_CHARS) if limit is None else limit
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n[cut: {len(text) - limit} more characters]"


def as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str, sort_keys=True)


# ---- what the model is offered -------------------------------------------------------------


def offered(step: Step) -> dict[str, tools.Tool]:
    """The tools the step may use, by the names the model sees: its `tools`, or every
    read-only built-in when it names none; never a side-effect tool on a read-only step."""
    names = step.tools or [n for n in tools.names() if not tools.get(n).side_effect]
    found = {}
    for name in tools.expand(names):
        tool = tools.find(name)
        if tool is None or tool.disabled() or (tool.side_effect and not step.side_effect):
            continue
        found[model_name(name)] = tool
    return found


ARG_TYPES = {"string", "number", "integer", "boolean", "object"}


def _schema(arg: tools.Arg) -> dict[str, Any]:
    if arg.type in ARG_TYPES:
        return {"type": arg.type}
    if arg.type == "list":
        items = {"type": arg.items} if arg.items in ARG_TYPES else {}
        return {"type": "array", "items": items}
    return {}


def tool_specs(step: Step) -> list[dict[str, Any]]:
    specs = [
        {
            "type": "function",
            "function": {
                "name": name,
                "description": (tool.description or f"the tool '{tool.name}'")
                + (" (side effect: happens once)" if tool.side_effect else " (read-only)"),
                "parameters": tool.input_schema
                or {
                    "type": "object",
                    "properties": {a: _schema(spec) for a, spec in tool.args.items()},
                    "required": [a for a, spec in tool.args.items() if spec.required],
                },
            },
        }
        for name, tool in offered(step).items()
    ]
    if turns.is_turn(step):
        specs += [PROPOSE_SPEC, PROPOSE_SCHEDULE_SPEC]
    return [*specs, *ENDING_TOOLS]


PROPOSE_SPEC = {
    "type": "function",
    "function": {
        "name": turns.PROPOSE,
        "description": "Propose a task to Dad: it runs only when he approves it.",
        "parameters": {
            "type": "object",
            "properties": {
                "title": {"type": "string"},
                "instructions": {"type": "string"},
                "steps": {"type": "array", "items": {"type": "object"}},
            },
            "required": ["title", "steps"],
        },
    },
}
PROPOSE_SCHEDULE_SPEC = {
    "type": "function",
    "function": {
        "name": turns.PROPOSE_SCHEDULE,
        "description": "Propose a schedule to Dad: it starts only when he approves it.",
        "parameters": {
            "type": "object",
            "properties": {
                "title": {"type": "string"},
                "schedule": {"type": "string", "description": "a cron expression"},
                "timezone": {"type": "string"},
                "steps": {"type": "array", "items": {"type": "object"}},
            },
            "required": ["title", "schedule", "steps"],
        },
    },
}


ENDING_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": COMMIT,
            "description": "End this step with a verdict.",
            "parameters": {
                "type": "object",
                "properties": {
                    "verdict": {"type": "string", "enum": list(VERDICTS)},
                    "output": {"description": "the step's output (any JSON), for 'done'"},
                    "error": {"type": "string", "description": "why, for failed/retry"},
                    "question": {"type": "string", "description": "for 'blocked': ask Dad"},
                },
                "required": ["verdict"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": SAY,
            "description": "Write to Dad in the conversation (a message, not a side effect).",
            "parameters": {
                "type": "object",
                "properties": {"text": {"type": "string"}},
                "required": ["text"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": ADD_STEPS,
            "description": "Revise the plan: add steps (plan-file steps) after a step's key.",
            "parameters": {
                "type": "object",
                "properties": {
                    "steps": {"type": "array", "items": {"type": "object"}},
                    "after": {"type": "string"},
                },
                "required": ["steps"],
            },
        },
    },
]


def plan_tools() -> list[str]:
    """Every tool a plan may use now, as a plan names it (`email.send`), one line each: what
    the planning step's briefing lists (a tool switched off is left out: plans refuse it)."""
    lines = []
    for name in tools.names():
        tool = tools.get(name)
        if tool.disabled():
            continue
        kind = "side effect" if tool.side_effect else "read-only"
        args = ", ".join(
            f"{arg}{'' if spec.required else '?'} ({_arg_type(spec)})"
            for arg, spec in tool.args.items()
        )
        about = f" ({tool.description[:200]})" if tool.description else ""
        lines.append(f"- {name}: {kind}; args: {args or 'none'}{about}")
    return lines


def _arg_type(arg: tools.Arg) -> str:
    return f"list of {arg.items}" if arg.type == "list" and arg.items else arg.type


def briefing(step: Step) -> str:
    """What the model is told at the start of each attempt; a planning tick (its task is
    `planning`) is told too every tool its plan may use."""
    task = step.task
    lines = [f"Task: {task.title}"]
    if task.instructions:
        lines += ["Goal:", task.instructions]
    lines.append("Plan (key, title, state, output so far):")
    plan = []
    for key, title, state, output in task.steps.order_by("position").values_list(
        "key", "title", "state", "output"
    ):
        line = f"- {key}: {title} [{state}]"
        if output is not None:
            line += f" output: {cut(as_text(output))}"
        plan.append(line)
    # A long plan is cut too, with its note (the step's own part follows it, whole).
    lines.append(cut("\n".join(plan), PLAN_TIMES * int(settings.LOOP_LLM_RESULT_CHARS)))
    lines += [
        f"Your step now: {step.key}: {step.title} (attempt {step.attempts} of {step.max_attempts})",
        "Instructions:",
        step.instructions,
    ]
    if task.state == TaskState.PLANNING or turns.is_turn(step):
        lines += ["Tools a plan may use (name: read-only or side effect; args, ? if optional):"]
        lines += plan_tools()
    return "\n".join(lines)


class Context:
    """What every request of a step's tick carries besides its transcript (DESIGN.md §10,
    §17): the conversation with Dad, read anew for each request that a message came before
    (he may write while the step runs), and Dad's answers to the questions of the step's task
    with his words (a denial of a tool step's call, and why, included: Pippa may propose a
    replacement), read once: he answers only a blocked step, and no step of a task is blocked
    while one of its steps runs. `text()` is "" when there is neither."""

    def __init__(self, step: Step) -> None:
        from .. import conversation

        self.step = step
        self.start = conversation.start_of(step.task)
        self.answers = _answers(step)
        self.talk: tuple[int | None, str] | None = None  # as read after that latest message

    def text(self) -> str:
        from .. import conversation

        latest = conversation.latest_id()
        if self.talk is None or self.talk[0] != latest:
            self.talk = (latest, conversation.for_model(self.step.task, self.start))
        parts = [self.talk[1]] if self.talk[1] else []
        if self.answers:
            parts.append("Dad's answers to this task's questions (oldest first):")
            parts.extend(self.answers)
        return "\n".join(parts)


def _answers(step: Step) -> list[str]:
    """Dad's latest answers to the questions of the step's task, oldest first."""
    answers = []
    for key, data, at in (
        Event.objects.filter(task_id=step.task_id, kind=EventKind.DECISION)
        .order_by("-id")
        .values_list("step__key", "data", "created_at")[:ANSWERS]
    ):
        note = cut(str(data.get("note") or ""), NOTE_CHARS)
        edited = data.get("edited")
        about = "this step" if key == step.key else f"step '{key}'"
        said = f"- {at:%H:%M} UTC, about {about}: {data.get('decision')}"
        if edited:
            said += f" (Dad edited the call's arguments to {as_text(edited.get('after'))})"
        answers.append(f"{said}: {note}" if note else said)
    return list(reversed(answers))


ANSWERS = 10  # the latest answers to a task's questions that its model requests carry
NOTE_CHARS = 2000
