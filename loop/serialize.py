"""The stable JSON shapes of DESIGN.md §13 (`task --json`, `tasks --json`, the API)."""

from __future__ import annotations

from typing import Any

from . import goals, questions, transcript
from .models import Effect, Event, Origin, Step, Task, TranscriptEntry


def effect_dict(effect: Effect) -> dict[str, Any]:
    return {
        "id": effect.pk,
        "tool": effect.tool,
        "state": effect.state,
        "target": effect.target,
        "summary": effect.summary,
        "request_view": [f.as_dict() for f in questions.of_effect(effect).fields],
        "evidence": effect.evidence,
        "error": effect.error,
        "response": effect.response,
        "sends": effect.sends,
    }


def question_dict(step: Step, effects: list[Effect]) -> dict[str, Any] | None:
    asked = questions.question(step, effects)
    if asked is None:
        return None
    own = asked.own_call
    return {
        "kind": asked.kind,
        "text": step.question_text,
        # The same call already happened in the task: those effects (shown first).
        "already": asked.already,
        # "May I do this?" before any effect was recorded: the call itself, in full.
        "call": own.as_dict() if own else None,
        "effects": [effect_dict(e) for e in asked.effects],
    }


def entry_dict(entry: TranscriptEntry, effects: dict[str, Effect]) -> dict[str, Any]:
    """One message of a model step's transcript; a side-effect call's result names the effect
    it produced, with its state and receipt."""
    effect = effects.get(entry.effect_id) if entry.effect_id else None
    return {
        "seq": entry.seq,
        "attempt": entry.attempt,
        "role": entry.role,
        "content": entry.content,
        "tool_calls": entry.tool_calls or [],
        "tool_call_id": entry.tool_call_id or None,
        "effect": (
            {
                "id": effect.pk,
                "tool": effect.tool,
                "state": effect.state,
                "response": effect.response,
            }
            if effect
            else ({"id": entry.effect_id} if entry.effect_id else None)
        ),
        "tokens": {"prompt": entry.prompt_tokens, "completion": entry.completion_tokens},
        "at": entry.created_at.isoformat(),
    }


def step_dict(
    step: Step,
    effects: list[Effect] | None = None,
    entries: list[TranscriptEntry] | None = None,
) -> dict[str, Any]:
    """The step with its effects and transcript (read here unless the caller read them)."""
    if effects is None:
        effects = list(step.effects.order_by("created_at"))
    if entries is None:
        entries = list(step.transcript.order_by("seq"))
    by_id = {e.pk: e for e in effects}
    return {
        "id": step.pk,
        "key": step.key,
        "title": step.title,
        "tool": step.tool,
        "args": step.args,
        "state": step.state,
        "attempts": step.attempts,
        "max_attempts": step.max_attempts,
        "side_effect": step.side_effect,
        "confirm_before": step.confirm_before,
        "output": step.output,
        "error": step.error,
        "question": question_dict(step, effects),
        "effects": [effect_dict(e) for e in effects],
        "judge": step.judge,
        "written_by": {"kind": step.writer, "name": step.written_by},
        "proposed": step.proposed,
        "instructions": step.instructions,
        "tools": step.tools,
        "transcript": [entry_dict(e, by_id) for e in entries],
        "tokens": transcript.tokens(entries),
    }


def task_summary(task: Task) -> dict[str, Any]:
    return {"id": task.pk, "title": task.title, "state": task.state}


def task_dict(task: Task) -> dict[str, Any]:
    """The whole task: four statements (its steps, its effects, its transcript, its events),
    whatever its length."""
    steps = list(task.steps.order_by("position"))
    by_step: dict[int, list[Effect]] = {}
    for effect in Effect.objects.filter(task=task).order_by("created_at"):
        by_step.setdefault(effect.step_id, []).append(effect)
    said: dict[int, list[TranscriptEntry]] = {}
    for entry in TranscriptEntry.objects.filter(task=task).order_by("step_id", "seq"):
        said.setdefault(entry.step_id, []).append(entry)
    return {
        **task_summary(task),
        "created_at": task.created_at.isoformat(),
        "successor": task.successor_id,
        "driver": task.driver,
        "waits_for_approval": goals.waits_for_approval(task),
        "instructions": task.instructions,
        "tokens": transcript.tokens([e for entries in said.values() for e in entries]),
        "steps": [step_dict(s, by_step.get(s.pk, []), said.get(s.pk, [])) for s in steps],
        "origin": origin_dict(task),
        "events": [event_dict(e) for e in Event.objects.filter(task=task).order_by("id")],
    }


def origin_dict(task: Task) -> dict[str, Any]:
    """Where the task came from: `{"kind", "schedule"?, "message"?}`."""
    found: dict[str, Any] = {"kind": task.origin}
    if task.origin == Origin.SCHEDULE and task.origin_run is not None:
        found["schedule"] = task.origin_run.schedule.name
        found["run"] = task.origin_run_id
    if task.origin_message_id is not None:
        found["message"] = task.origin_message_id
    return found


def event_dict(event: Event) -> dict[str, Any]:
    return {
        "id": event.pk,
        "kind": event.kind,
        "step": event.step_id,
        "actor": event.actor,
        "at": event.created_at.isoformat(),
        "data": event.data,
    }
