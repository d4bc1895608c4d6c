"""The words of a blocked step's question, naming each effect."""

from __future__ import annotations

from collections.abc import Iterable

from .models import Effect, QuestionKind


def describe(effects: Iterable[Effect]) -> str:
    lines = []
    for effect in effects:
        line = f"{effect.tool} → {effect.target or '(no target)'}: {effect.summary}"
        if effect.evidence:
            line += f" [checked: {effect.evidence}]"
        lines.append(line)
    return "\n".join(lines)


def may_i(tool: str, target: str, summary: str, *, unsent: bool) -> tuple[str, str]:
    text = f"May I do this?\n{tool} → {target or '(no target)'}: {summary}"
    if unsent:
        text += "\nThe earlier try was interrupted before the call went out: nothing was sent."
    return QuestionKind.MAY_I, text


def did_it_happen(effects: Iterable[Effect]) -> tuple[str, str]:
    return QuestionKind.DID_IT_HAPPEN, "Did this happen?\n" + describe(effects)
