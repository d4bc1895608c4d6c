"""A model step's durable transcript (DESIGN.md §12): one conversation per step across its
attempts, one `TranscriptEntry` row per message.

The writers keep it paired whatever fails: an assistant reply and its tool calls are one row
(committed before any call runs); a result is written only for a call of that step's
transcript that has none yet (`add_result` checks, in its transaction, and the unique
constraint `transcript_one_result` backs it). Each write — one entry, or the results of a
reply's read-only calls together (`add_results`) — is its own commit unless the caller holds a
transaction (then the result commits with what the call did, e.g. `add_steps`).

Every text stored is valid UTF-8 without NUL, whatever the model or a tool sent (PostgreSQL
refuses both, and a refused write would end the tick): a NUL is removed, a surrogate UTF-8
cannot hold becomes U+FFFD (`clean`), and the entry says so in a last line of its text
(`[changed to be stored: …]`) and in its journal event (`changed`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Count, Sum

from . import journal, sql
from .models import Event, EventKind, Step, TranscriptEntry

Role = TranscriptEntry.Role
CHANGED = "changed to be stored"


class Orphan(Exception):
    """A result for a call the transcript does not hold, or holds a result for already."""


def clean(text: str) -> tuple[str, str]:
    """`text` as every database stores it — valid UTF-8, no NUL — and what was changed to
    make it so ('' when nothing was)."""
    if "\x00" not in text and (text.isascii() or _utf8(text)):
        return text, ""
    changes = []
    nul = text.count("\x00")
    if nul:
        text = text.replace("\x00", "")
        changes.append(f"{nul} NUL character{'s' if nul > 1 else ''} removed")
    if not _utf8(text):
        odd = sum(1 for c in text if "\ud800" <= c <= "\udfff")
        # A pair split in two becomes its one character; a lone one U+FFFD.
        text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        changes.append(f"{odd} surrogate{'s' if odd > 1 else ''} UTF-8 cannot hold replaced")
    return text, ", ".join(changes)


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _cleaned(content: str, changes: list[str]) -> str:
    """`content` with a last line saying what was changed, if anything was."""
    if not changes:
        return content
    note = f"[{CHANGED}: {'; '.join(changes)}]"
    return f"{content}\n{note}" if content else note


def entries(step: Step) -> list[TranscriptEntry]:
    """The step's conversation, in order (index transcript_step_seq)."""
    return list(TranscriptEntry.objects.filter(step_id=step.pk).order_by("seq"))


def _read(step: Step, *, whole: bool) -> Rows:
    """The step's entries in order: `whole`, or only what a writer checks and numbers by."""
    if whole:
        return entries(step)
    found = TranscriptEntry.objects.filter(step_id=step.pk).order_by("seq")
    return list(found.only("seq", "role", "tool_calls", "tool_call_id"))


def _journaled(
    entry: TranscriptEntry, step: Step, actor: str, changes: list[str]
) -> TranscriptEntry:
    """Journal the new entry in its transaction: the live pages follow the journal."""
    data: dict[str, Any] = {"seq": entry.seq, "role": entry.role}
    if changes:
        data["changed"] = "; ".join(changes)
    if entry.tool_call_id:
        data["tool_call_id"] = entry.tool_call_id
    if entry.effect_id:
        data["effect_id"] = entry.effect_id
    journal.record(EventKind.TRANSCRIPT_ENTRY, step=step, actor=actor, **data)
    return entry


def add(
    step: Step, role: str, content: str, *, actor: str = "", rows: Rows | None = None
) -> TranscriptEntry:
    """A system or user message."""
    assert role in (Role.SYSTEM, Role.USER), role
    content, change = clean(content)
    changes = [change] if change else []
    new = _New(changes, None, {"role": role, "content": _cleaned(content, changes)})
    return _added(step, rows, actor, [new])[0]


def add_reply(
    step: Step,
    content: str,
    tool_calls: list[dict[str, str]],
    *,
    prompt_tokens: int = 0,
    completion_tokens: int = 0,
    actor: str = "",
    rows: Rows | None = None,
) -> TranscriptEntry:
    """The model's reply with its calls, in one row: committed before any call runs."""
    content, change = clean(content)
    changes = [f"content: {change}"] if change else []
    kept = []
    for n, call in enumerate(tool_calls, start=1):
        one = {}
        for name, value in call.items():
            one[name], change = clean(value)
            if change:
                changes.append(f"call {n}'s {name}: {change}")
        kept.append(one)
    fields = {
        "role": Role.ASSISTANT,
        "content": _cleaned(content, changes),
        "tool_calls": kept,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
    }
    return _added(step, rows, actor, [_New(changes, None, fields)])[0]


def add_result(
    step: Step,
    call_id: str,
    content: str,
    effect_id: str = "",
    *,
    actor: str = "",
    rows: Rows | None = None,
) -> TranscriptEntry:
    """The one result of the call `call_id`: refused (`Orphan`) unless that call is in the
    step's transcript without a result."""
    return _added(step, rows, actor, [_result(step, call_id, content, effect_id)])[0]


def add_results(step: Step, results: list[tuple[str, str]], *, actor: str, rows: Rows) -> None:
    """Several calls' results, `(call_id, content)` in order, in one commit: the read-only calls
    of one reply, each result committed before the next request (DESIGN.md §12) but not each
    in a commit of its own. Each checked as `add_result` checks it."""
    _added(step, rows, actor, [_result(step, call_id, text) for call_id, text in results])


def _result(step: Step, call_id: str, content: str, effect_id: str = "") -> _New:
    content, change = clean(content)
    changes = [change] if change else []

    def unanswered(held: list[TranscriptEntry]) -> None:
        if not any(
            call.get("id") == call_id
            for r in held
            if r.role == Role.ASSISTANT
            for call in r.tool_calls or []
        ):
            raise Orphan(f"step '{step.key}': no call {call_id!r} in its transcript")
        if any(r.role == Role.TOOL and r.tool_call_id == call_id for r in held):
            raise Orphan(f"step '{step.key}': call {call_id!r} has its result already")

    fields = {
        "role": Role.TOOL,
        "content": _cleaned(content, changes),
        "tool_call_id": call_id,
        "effect_id": effect_id,
    }
    return _New(changes, unanswered, fields)


# The step's transcript as a caller holds it (`entries`), kept whole by the writers it is given
# to: each new entry is appended. A model step's tick holds it, so a turn reads nothing back.
Rows = list[TranscriptEntry]


@dataclass(frozen=True)
class _New:
    """An entry to write: what was changed to store it, the check of the transcript before
    it (or None), its fields."""

    changes: list[str]
    check: Callable[[Rows], None] | None
    fields: dict[str, Any]


def _added(step: Step, rows: Rows | None, actor: str, new: list[_New]) -> list[TranscriptEntry]:
    """The step's next entries, journaled, in one transaction (or the caller's): each checked
    against the transcript before it and numbered after its last entry. Given the caller's
    `rows`, those are the transcript (nothing read) and get the entries; if another writer
    numbered an entry meanwhile (a holder whose lease moved on), the unique (step, seq) refuses
    them, and the transcript is read and checked again."""
    for held in (rows, None) if rows is not None else (None,):
        current = held if held is not None else _read(step, whole=rows is not None)
        made: list[TranscriptEntry] = []
        try:
            with transaction.atomic(), journal.batched():
                for one in new:
                    before = [*current, *made] if made else current
                    if one.check is not None:
                        one.check(before)
                    values = {
                        "task_id": step.task_id,
                        "step_id": step.pk,
                        "attempt": step.attempts,
                        "seq": before[-1].seq + 1 if before else 0,
                        **one.fields,
                    }
                    made.append(
                        _journaled(sql.create(TranscriptEntry, values), step, actor, one.changes)
                    )
        except IntegrityError:
            if held is None:
                raise
            continue
        if rows is not None:
            rows[:] = [*current, *made]
        return made
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class Dangling:
    """A call of the last reply still without a result: which reply, its place, the call."""

    entry: TranscriptEntry
    index: int
    call: dict[str, str]


def dangling(rows: list[TranscriptEntry]) -> list[Dangling]:
    """The calls of the last assistant reply that have no result yet, in order."""
    replies = [r for r in rows if r.role == Role.ASSISTANT]
    if not replies:
        return []
    last = replies[-1]
    answered = {r.tool_call_id for r in rows if r.role == Role.TOOL}
    return [
        Dangling(last, n, call)
        for n, call in enumerate(last.tool_calls or [])
        if call.get("id") not in answered
    ]


def unpaired(rows: list[TranscriptEntry]) -> list[str]:
    """What breaks the pairing: a result without its call, a call with two results, a call
    without a result that is not in the last reply (only the last may be still running)."""
    problems = []
    calls: dict[str, int] = {}
    for row in rows:
        for call in row.tool_calls or []:
            calls[call["id"]] = row.seq
    results: dict[str, int] = {}
    for row in rows:
        if row.role == Role.TOOL:
            results[row.tool_call_id] = results.get(row.tool_call_id, 0) + 1
            if row.tool_call_id not in calls:
                problems.append(f"result {row.seq} answers no call")
    for call_id, count in results.items():
        if count > 1:
            problems.append(f"call {call_id} has {count} results")
    last = max((r.seq for r in rows if r.role == Role.ASSISTANT), default=None)
    for call_id, seq in calls.items():
        if call_id not in results and seq != last:
            problems.append(f"call {call_id} has no result")
    return problems


def messages(rows: list[TranscriptEntry]) -> list[dict[str, Any]]:
    """The conversation as chat-completions messages."""
    found: list[dict[str, Any]] = []
    for row in rows:
        if row.role == Role.ASSISTANT:
            message: dict[str, Any] = {"role": "assistant", "content": row.content or None}
            if row.tool_calls:
                message["tool_calls"] = [
                    {
                        "id": c["id"],
                        "type": "function",
                        "function": {"name": c["name"], "arguments": c["arguments"]},
                    }
                    for c in row.tool_calls
                ]
            found.append(message)
        elif row.role == Role.TOOL:
            found.append({"role": "tool", "tool_call_id": row.tool_call_id, "content": row.content})
        else:
            found.append({"role": row.role, "content": row.content})
    return found


def pending_call(step: Step) -> tuple[str, Any]:
    """The side-effect call the step waits on ("May I do this?"): the first call of its last
    reply without a result that names a side-effect tool, as (tool name, args) — the args as
    Dad edited them, if he did (`edit_of`); ("", {}) if none. What an authorization of a model
    step covers (`loop.calls.of`)."""
    call_id, name, args = pending(step)
    if call_id:
        edited = edit_of(step, call_id)
        if edited is not None:
            args = edited
    return name, args


def pending(step: Step) -> tuple[str, str, Any]:
    """(call id, tool name, args as the model wrote them) of the call `pending_call` names;
    ("", "", {}) if none."""
    from . import tools

    for one in dangling(entries(step)):
        name = tool_named(one.call.get("name", ""))
        tool = tools.find(name) if name else None
        if tool is None or not tool.side_effect:
            continue
        try:
            args = json.loads(one.call.get("arguments") or "{}")
        except ValueError:
            continue
        return one.call.get("id", ""), name, args
    return "", "", {}


def edit_of(step: Step, call_id: str) -> dict[str, Any] | None:
    """The arguments Dad gave the call `call_id` of the step with "Edit, then allow" (his
    latest such answer about it), or None: the call is made as he edited it."""
    found = (
        Event.objects.filter(step_id=step.pk, kind=EventKind.DECISION, data__call_id=call_id)
        .order_by("-id")
        .values_list("data", flat=True)
        .first()
    )
    edited = found.get("edited") if isinstance(found, dict) else None
    return edited.get("after") if isinstance(edited, dict) else None


def tool_named(model_name: str) -> str:
    """The loop's name of the tool a call names as the model wrote it (`email_send` →
    `email.send`); "" if none is installed by that name."""
    from . import tools

    return {name.replace(".", "_"): name for name in tools.names()}.get(model_name, "")


def tokens(rows: list[TranscriptEntry]) -> dict[str, int]:
    """The tokens these entries used (the endpoint's `usage` of each reply), summed."""
    return {
        "prompt": sum(r.prompt_tokens for r in rows),
        "completion": sum(r.completion_tokens for r in rows),
    }


def usage(step_ids: list[int]) -> dict[int, dict[str, int]]:
    """For each of these steps that has a transcript: how many entries it holds and the
    tokens they used, summed by the database (one statement, by index transcript_step_seq),
    so a page that shows only the last entries still counts them all."""
    found = (
        TranscriptEntry.objects.filter(step_id__in=step_ids)
        .values("step_id")
        .annotate(
            entries=Count("id"), prompt=Sum("prompt_tokens"), completion=Sum("completion_tokens")
        )
        .order_by()
    )
    return {
        row["step_id"]: {
            "entries": row["entries"],
            "prompt": row["prompt"] or 0,
            "completion": row["completion"] or 0,
        }
        for row in found
    }


def task_usage(task_id: int) -> dict[str, int]:
    """The same for a whole task: its entries and tokens, over every step (one statement)."""
    found = TranscriptEntry.objects.filter(task_id=task_id).aggregate(
        entries=Count("id"), prompt=Sum("prompt_tokens"), completion=Sum("completion_tokens")
    )
    return {key: value or 0 for key, value in found.items()}
