"""The task's journal in words, as Dad reads it: what happened, by whom, in a sentence."""

from __future__ import annotations

from typing import Any

KINDS: dict[str, str] = {
    "task_created": "Task made",
    "task_state": "Task moved",
    "steps_added": "Steps added",
    "step_started": "Step started",
    "step_restarted": "Step started again",
    "step_done": "Step done",
    "step_retry": "Step will try again",
    "step_failed": "Step failed",
    "step_blocked": "Step asks you",
    "step_unblocked": "Answered",
    "step_edited": "Step changed",
    "decision": "Your answer",
    "decision_refused": "Refused",
    "authorization_consumed": "Permission used",
    "authorization_cleared": "Permission cleared",
    "call_refused": "Call refused",
    "side_effect_auto_confirmed": "Ran under the schedule's permission",
    "side_effect_resumed_unsent": "Sending resumed",
    "effect_state": "Effect moved",
    "receipt_hit": "Already done (receipt found)",
    "probe": "Checked with the receiver",
    "late_result": "Late result",
    "lease_released": "Let go",
    "schedule_fired": "Started by a schedule",
    "schedule_failed": "Schedule failed",
    "model_retry": "Pippa tries again",
    "model_call_refused": "Pippa's call refused",
    "transcript_entry": "Pippa's conversation",
    "plan_approved": "Plan approved",
    "plan_declined": "Plan declined",
    "task_given": "Given to an agent",
}


def kind(name: str) -> str:
    return KINDS.get(name, name.replace("_", " ").capitalize())


def who(actor: str) -> str:
    """ "worker:3" → "worker 3", "agent:pippa" → "agent pippa", "cli:root" → "root (at the
    shell)", "schedule:x" → "schedule x"."""
    head, _, rest = actor.partition(":")
    if not rest:
        return actor
    if head == "cli":
        return f"{rest} (at the shell)"
    return f"{head} {rest}"


def details(kind_name: str, data: dict[str, Any]) -> str:
    """The event's data in words; the fields no sentence covers, shortly, after."""
    said: list[str] = []
    rest = dict(data)
    old, new = rest.pop("old", None), rest.pop("new", None)
    if old and new:
        said.append(f"{old} → {new}")
    for name in ("reason", "error", "decision", "note", "why"):
        value = rest.pop(name, None)
        if value:
            said.append(str(value) if name != "note" else f"note: {value}")
    if "attempts" in rest:
        n = rest.pop("attempts")
        if n:
            said.append(f"attempt {n}")
    if kind_name == "steps_added" and rest.get("keys"):
        said.append(", ".join(map(str, rest.pop("keys")))[:200])
    for name in ("call", "digest", "cut", "at", "proposed", "written_by", "retry_of"):
        rest.pop(name, None)
    for name, value in rest.items():
        if value in ("", None, [], {}, False):
            continue
        text = value if isinstance(value, str) else str(value)
        said.append(f"{name.replace('_', ' ')}: {text[:120]}")
    return "; ".join(said)
