"""What the task page shows of a model step's transcript (DESIGN.md §12, "Dad sees Pippa
think"): the model's words, each call with its arguments and its result, the effect a
side-effect call produced with its state and receipt, the tokens each reply used; each
attempt apart. Every text is shown escaped by the templates (model text is never `|safe`).

Bounded whatever the transcript's length: a step card shows the last `SHOWN` entries of its
step, read for all the page's model steps in one statement (a window function over the
index transcript_step_seq); how many there are and the tokens they used come from one
aggregate (`transcript.usage`); the effects are the ones the page read for its steps. The
whole transcript is a link away (`/steps/ID/transcript`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django.db.models import F, Window
from django.db.models.functions import RowNumber

from ... import tools, transcript
from ...effects import call_digest
from ...models import Effect, Step, TranscriptEntry
from ...tools import shown

SHOWN = 30  # entries a step card shows: the latest ones

Role = TranscriptEntry.Role


@dataclass(frozen=True)
class Result:
    """A call's result as shown: its text (folded when long), and the effect it produced."""

    row: TranscriptEntry
    text: shown.Field
    effect: Effect | None
    receipt: str  # the effect's response, pretty JSON


@dataclass(frozen=True)
class Call:
    id: str
    name: str  # as the model wrote it: email_send
    tool: str  # the loop's name of it, when it names an installed tool: email.send
    arguments: list[shown.Field]  # as a person is shown the call (credentials not shown)
    result: Result | None  # None: still waiting (a question for Dad, or running now)
    effect: Effect | None  # the effect of the call, once its intent was recorded
    index: int
    key: str  # its folds' ids: the reply's row and the call's place in it


@dataclass(frozen=True)
class Entry:
    row: TranscriptEntry
    text: shown.Field
    calls: list[Call]
    result: Result | None = None  # a result shown alone: its call is before those shown

    @property
    def tokens(self) -> bool:
        return bool(self.row.prompt_tokens or self.row.completion_tokens)


@dataclass(frozen=True)
class Attempt:
    number: int
    entries: list[Entry]


@dataclass(frozen=True)
class Transcript:
    step: Step
    attempts: list[Attempt]
    total: int  # entries in the whole transcript
    prompt: int  # tokens, the whole transcript's
    completion: int
    shown: int

    @property
    def hidden(self) -> int:
        """How many earlier entries the card leaves out."""
        return self.total - self.shown


def of_steps(
    steps: list[Step], effects: dict[int, list[Effect]], *, last: int | None = SHOWN
) -> dict[int, Transcript]:
    """The transcripts of these steps' model steps, by step id, each its `last` entries (all
    of them with None); `effects` are each step's effects (the page read them already). Two
    statements for any number of steps and entries, none when no step is a model step."""
    ids = [s.pk for s in steps if s.judge == "model"]
    counts = transcript.usage(ids) if ids else {}
    if not counts:
        return {}
    rows = TranscriptEntry.objects.filter(step_id__in=list(counts))
    if last is not None:
        rows = rows.annotate(
            back=Window(RowNumber(), partition_by=[F("step_id")], order_by=F("seq").desc())
        ).filter(back__lte=last)
    by_step: dict[int, list[TranscriptEntry]] = {}
    for row in rows.order_by("step_id", "seq"):
        by_step.setdefault(row.step_id, []).append(row)
    found = {}
    for step in steps:
        if step.pk not in counts:
            continue
        mine = by_step.get(step.pk, [])
        sums = counts[step.pk]
        found[step.pk] = Transcript(
            step=step,
            attempts=_attempts(step, mine, {e.pk: e for e in effects.get(step.pk, [])}),
            total=sums["entries"],
            prompt=sums["prompt"],
            completion=sums["completion"],
            shown=len(mine),
        )
    return found


def _attempts(step: Step, rows: list[TranscriptEntry], effects: dict[str, Effect]) -> list[Attempt]:
    """The rows as entries, each call with its result under it, grouped by attempt."""
    results = {r.tool_call_id: r for r in rows if r.role == Role.TOOL}
    placed: set[str] = set()  # results shown under their call
    entries: list[Entry] = []
    for row in rows:
        if row.role == Role.ASSISTANT:
            calls = [
                _call(step, row, n, one, results, effects)
                for n, one in enumerate(row.tool_calls or [])
            ]
            placed.update(c.id for c in calls if c.result is not None)
            entries.append(Entry(row, shown.Field("Pippa", row.content), calls))
        elif row.role == Role.TOOL:
            if row.tool_call_id not in placed:
                entries.append(Entry(row, shown.Field("", ""), [], _result(row, effects)))
        else:
            entries.append(Entry(row, shown.Field(row.role, row.content), []))
    attempts: list[Attempt] = []
    for entry in entries:
        if not attempts or attempts[-1].number != entry.row.attempt:
            attempts.append(Attempt(entry.row.attempt, []))
        attempts[-1].entries.append(entry)
    return attempts


def _call(
    step: Step,
    row: TranscriptEntry,
    index: int,
    one: dict[str, str],
    results: dict[str, TranscriptEntry],
    effects: dict[str, Effect],
) -> Call:
    name = one.get("name", "")
    loop_name = transcript.tool_named(name)
    raw = one.get("arguments") or ""
    args: Any = None
    try:
        args = json.loads(raw or "{}")
    except ValueError:
        arguments = [shown.Field("Arguments", raw, "code")]  # as the model wrote them
    else:
        # An installed tool's call as its "May I do this?" shows it (one way to show a call);
        # any other call's arguments as JSON.
        found = tools.find(loop_name) if loop_name else None
        if found is not None:
            arguments = found.request_view(args)
        else:
            arguments = [shown.Field("Arguments", shown.json_text(args), "json")]
    answer = results.get(one.get("id", ""))
    result = _result(answer, effects) if answer is not None else None
    # Its effect, if it has one: the result names it; before the result (a question for Dad,
    # a cut), the step's latest effect of that exact call.
    effect = result.effect if result else _of_call(effects, loop_name, args)
    key = f"{row.pk}-{index}"
    return Call(one.get("id", ""), name, loop_name, arguments, result, effect, index, key)


def _of_call(effects: dict[str, Effect], tool_name: str, args: Any) -> Effect | None:
    if not tool_name or not isinstance(args, dict):
        return None
    call = call_digest(tool_name, args)
    same = [e for e in effects.values() if e.call == call]
    return max(same, key=lambda e: e.again) if same else None


def _result(row: TranscriptEntry, effects: dict[str, Effect]) -> Result:
    effect = effects.get(row.effect_id) if row.effect_id else None
    receipt = shown.pretty(effect.response) if effect is not None and effect.response else ""
    return Result(row, shown.Field("Result", row.content, "code"), effect, receipt)


def of_step(step: Step) -> Transcript | None:
    """One step's whole transcript (the "show all" page): every entry."""
    effects = list(Effect.objects.filter(step_id=step.pk).order_by("created_at", "id"))
    return of_steps([step], {step.pk: effects}, last=None).get(step.pk)
