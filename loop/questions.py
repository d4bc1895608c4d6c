"""A blocked step's question: its words, written when it is asked, and the calls it names, as a
person is shown them. `question()` is the one rule for what a question names and shows; the
dashboard's card, `manage.py task` / `unblock` and the API's `question` all read it."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from . import plans, tools, transcript
from .effects import call_digest, canonical
from .models import Effect, EffectState, QuestionKind, Step, StepState
from .tools import shown

ARROW = " → "  # a line of the question's text that names a call: "tool → target: summary"
UNSENT = "The earlier try was interrupted before the call went out: nothing was sent."


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
        text += f"\n{UNSENT}"
    return QuestionKind.MAY_I, text


def did_it_happen(effects: Iterable[Effect]) -> tuple[str, str]:
    return QuestionKind.DID_IT_HAPPEN, "Did this happen?\n" + describe(effects)


def already_line(effect: Effect) -> str:
    """How a question names an earlier effect of the exact call it asks about."""
    at = effect.updated_at.strftime("%H:%M UTC on %b %d")
    if effect.state == EffectState.FAILED:
        return f"This exact call was tried at {at} and refused: {effect.error}"
    receipt = json.dumps(effect.response, default=str, sort_keys=True) if effect.response else ""
    if len(receipt) > RECEIPT_CHARS:
        receipt = receipt[: RECEIPT_CHARS - 1] + "…"
    return (
        f"This exact call already happened at {at} (receipt {effect.pk[:8]}…"
        + (f": {receipt}" if receipt else "")
        + ")."
    )


RECEIPT_CHARS = 200  # the receipt as a repeat's warning shows it


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
    call: str = ""  # its digest (`effects.call_digest`): the same call elsewhere is this one

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
        return plans.resolved_args(step)
    except tools.ToolError:
        return step.args


def of_step(step: Step) -> Request:
    """The step's own call, before any effect of it was recorded (a model step's: the
    side-effect call it waits on)."""
    name, args = (step.tool, asked_args(step))
    if step.judge == "model":
        name, args = transcript.pending_call(step)
    tool = tools.find(name)
    call = call_digest(name, args)
    if tool is None:
        missing = f"tool '{name}' is not installed"
        return Request("call", name, "", missing, shown.default(args), call=call)
    try:
        target, summary = tool.summary(args)
    except (tools.ToolError, TypeError, ValueError, AttributeError, KeyError):
        target, summary = "", ""
    return Request("call", name, target, summary, tool.request_view(args), call=call)


def of_effect(effect: Effect) -> Request:
    """An effect's request as recorded with its intent: what was, or will be, sent."""
    tool = tools.find(effect.tool)
    fields = tool.request_view(effect.request) if tool else shown.default(effect.request)
    return Request(
        effect.pk, effect.tool, effect.target, effect.summary, fields, effect, call=effect.call
    )


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


@dataclass(frozen=True)
class Question:
    """A blocked step's question as a person is shown it, whatever the door: its kind, the
    effects it names, each call it asks about in full, and its words beyond the heading and
    those calls."""

    step: Step
    kind: QuestionKind
    effects: list[Effect]  # the effects it names: what an answer settles
    requests: list[Request]  # the calls it asks about, each in full
    notes: list[str]
    # "May I do this?" about a call that already happened in the task: those effects, shown
    # first (`already_line`).
    repeats: list[Effect] = field(default_factory=list)

    @property
    def already(self) -> list[str]:
        return [already_line(e) for e in self.repeats]

    @property
    def heading(self) -> str:
        return str(self.kind.label)

    @property
    def may_i(self) -> bool:
        return self.kind == QuestionKind.MAY_I

    @property
    def own_call(self) -> Request | None:
        """The step's own call, when it asks "May I do this?" before any effect of the step
        was recorded."""
        return self.requests[0] if self.may_i and not self.effects else None

    @property
    def ended(self) -> bool:
        """Its task ended (superseded): the step never runs again, so only the answers that
        close the question can be given (actions.unblock refuses the others)."""
        return self.step.task.ended


def question(step: Step, effects: Iterable[Effect]) -> Question | None:
    """The question of a blocked step (None for any other step), with the effects it names
    (`named`) among the step's `effects`. Its calls are shown from the rows, never read back
    from its text: the words beyond them are the "nothing was sent" of a "May I do this?" about
    an intent that never went out, or, with no call left to show, the text as written."""
    if step.state != StepState.BLOCKED or not step.question_kind:
        return None
    kind = QuestionKind(step.question_kind)
    about = named(step, effects)
    if kind == QuestionKind.MAY_I and not about:
        shown = [of_step(step)]
    else:
        shown = [of_effect(e) for e in about]
    if not shown:
        notes = [line for line in step.question_text.splitlines()[1:] if line.strip()]
    else:
        notes = [UNSENT] if kind == QuestionKind.MAY_I and about else []
    repeats: list[Effect] = []
    if kind == QuestionKind.MAY_I:
        asked = {r.call for r in shown if r.call}
        repeats = list(
            Effect.objects.filter(
                task_id=step.task_id, call__in=asked, state=EffectState.SUCCEEDED
            ).order_by("updated_at")
        )
    return Question(step, kind, about, shown, notes, repeats)
