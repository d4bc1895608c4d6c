"""A blocked step's question: its words, written when it is asked, and the calls it names, as a
person is shown them — read here for the dashboard, `manage.py task` and the API alike."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from . import tools, transcript
from .effects import canonical
from .judges.tool import resolved_args
from .models import Effect, EffectState, QuestionKind, Step
from .tools import shown

ARROW = " → "  # a line of the question's text that names a call: "tool → target: summary"


def describe(effects: Iterable[Effect]) -> str:
    lines = []
    for effect in effects:
        line = f"{effect.tool}{ARROW}{effect.target or '(no target)'}: {effect.summary}"
        if effect.evidence:
            line += f" [checked: {effect.evidence}]"
        lines.append(line)
    return "\n".join(lines)


def may_i(tool: str, target: str, summary: str, *, unsent: bool) -> tuple[str, str]:
    text = f"May I do this?\n{tool}{ARROW}{target or '(no target)'}: {summary}"
    if unsent:
        text += "\nThe earlier try was interrupted before the call went out: nothing was sent."
    return QuestionKind.MAY_I, text


def did_it_happen(effects: Iterable[Effect]) -> tuple[str, str]:
    return QuestionKind.DID_IT_HAPPEN, "Did this happen?\n" + describe(effects)


# ---- what a question shows -------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """One call as a person is shown it: its one line, and its fields in full."""

    key: str  # "call" (the step's own), or the effect's id: names the call's folds on a page
    tool: str
    target: str
    summary: str
    fields: list[shown.Field]
    effect: Effect | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "tool": self.tool,
            "target": self.target,
            "summary": self.summary,
            "request_view": [f.as_dict() for f in self.fields],
        }


def asked_args(step: Step) -> Any:
    """The args the step's call runs with: references filled from earlier outputs, or as
    written while one can't be (then the judge fails the step and nothing is sent)."""
    try:
        return resolved_args(step)
    except tools.ToolError:
        return step.args


def of_step(step: Step) -> Request:
    """The step's own call, before any effect of it was recorded (a model step's: the
    side-effect call it waits on)."""
    name, args = (step.tool, asked_args(step))
    if step.judge == "model":
        name, args = transcript.pending_call(step)
    tool = tools.find(name)
    if tool is None:
        missing = f"tool '{name}' is not installed"
        return Request("call", name, "", missing, shown.default(args))
    try:
        target, summary = tool.summary(args)
    except (tools.ToolError, TypeError, ValueError, AttributeError, KeyError):
        target, summary = "", ""
    return Request("call", name, target, summary, tool.request_view(args))


def of_effect(effect: Effect) -> Request:
    """An effect's request as recorded with its intent: what was, or will be, sent."""
    tool = tools.find(effect.tool)
    fields = tool.request_view(effect.request) if tool else shown.default(effect.request)
    return Request(effect.pk, effect.tool, effect.target, effect.summary, fields, effect)


def named(step: Step, effects: Iterable[Effect]) -> list[Effect]:
    """The effects a question is about. "Did this happen?": those whose outcome is unknown;
    "May I do this?": those of the step's current call not sent yet. Never a settled one."""
    if not step.question_kind:
        return []
    if step.question_kind == QuestionKind.DID_IT_HAPPEN:
        return [e for e in effects if e.state == EffectState.UNCERTAIN]
    # An edit may have left an earlier call's intent pending (it will never be sent): the
    # question is about the call that would run now, so only an intent of that call is named.
    now = canonical(asked_args(step))
    return [
        e
        for e in effects
        if e.state == EffectState.PENDING and e.tool == step.tool and canonical(e.request) == now
    ]


def asks_own_call(step: Step, named_effects: list[Effect]) -> bool:
    """Whether it is "May I do this?" before any effect of the step was recorded (it asks
    about the call itself)."""
    return step.question_kind == QuestionKind.MAY_I and not named_effects


def requests(step: Step, effects: Iterable[Effect]) -> list[Request]:
    """Every call the question asks about, each in full."""
    about = named(step, effects)
    if asks_own_call(step, about):
        return [of_step(step)]
    return [of_effect(e) for e in about]


def notes(step: Step, *, calls_shown: bool) -> list[str]:
    """The question's words beyond its heading; without its call lines when the calls are
    shown in full beside them."""
    lines = [line for line in step.question_text.splitlines()[1:] if line.strip()]
    return [line for line in lines if not calls_shown or ARROW not in line]
