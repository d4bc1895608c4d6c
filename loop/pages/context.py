"""What the dashboard's templates show, read in one place so that a page and the live push
render the same partial from the same context (`loop/live.py` calls these too).

Read-only: nothing here writes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Max
from django.utils import timezone

from .. import health, lease, questions, timeline
from ..models import Effect, Event, QuestionKind, Step, StepState, Task, TaskState

ACTIVE = (TaskState.RUNNING, TaskState.BLOCKED, TaskState.PAUSED, TaskState.PLANNING)
FINISHED = (TaskState.DONE, TaskState.FAILED, TaskState.SUPERSEDED)
JOURNAL_ROWS = 200
RECENT = 8


@dataclass
class Question:
    """A blocked step's question as Dad sees it: the words, the calls it names (each in full),
    the buttons."""

    step: Step
    kind: str
    heading: str
    lines: list[str]
    requests: list[questions.Request]

    @property
    def may_i(self) -> bool:
        return self.kind == QuestionKind.MAY_I


@dataclass
class Progress:
    task: Task
    done: int
    total: int
    current: Step | None
    holder: lease.Holder | None = None

    @property
    def percent(self) -> int:
        return round(100 * self.done / self.total) if self.total else 0


@dataclass
class StepView:
    step: Step
    effects: list[Effect]
    question: Question | None
    output: str
    current: bool = False
    # Each effect with its receipt and its request in full.
    receipts: list[tuple[Effect, str, questions.Request]] = field(default_factory=list)


def pretty(value: Any) -> str:
    """JSON for people: indented, unicode kept. Rendered escaped by the templates."""
    if value is None:
        return ""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)


def last_event_id() -> int:
    """Read before the page's content, so the page is at least as new as this id."""
    return Event.objects.aggregate(top=Max("id"))["top"] or 0


def seen_near(last: int) -> str:
    """The ids a page rendered now already reflects within the window where ids may still
    commit late (PostgreSQL), so its first live connection is not sent them again."""
    from ..live import trailing_window

    window = trailing_window()
    if not window:
        return ""
    ids = Event.objects.filter(id__gt=last - window, id__lte=last).values_list("id", flat=True)
    return ",".join(str(i) for i in ids)


def waiting_count() -> int:
    return Step.objects.blocked().count()


def question_of(step: Step, effects: list[Effect]) -> Question | None:
    if step.state != StepState.BLOCKED or not step.question_kind:
        return None
    kind = QuestionKind(step.question_kind)
    shown = questions.requests(step, effects)
    lines = questions.notes(step, calls_shown=bool(shown))
    return Question(step, kind, kind.label, lines, shown)


def _effects_by_step(step_ids: list[int]) -> dict[int, list[Effect]]:
    found: dict[int, list[Effect]] = {sid: [] for sid in step_ids}
    for effect in Effect.objects.filter(step_id__in=step_ids).order_by("created_at", "id"):
        found[effect.step_id].append(effect)
    return found


def needs_you() -> list[Question]:
    steps = list(Step.objects.blocked().select_related("task").order_by("task_id", "position"))
    effects = _effects_by_step([s.pk for s in steps])
    return [q for s in steps if (q := question_of(s, effects[s.pk])) is not None]


def progress() -> list[Progress]:
    tasks = list(Task.objects.filter(state__in=ACTIVE).order_by("-id"))
    steps: dict[int, list[Step]] = {t.pk: [] for t in tasks}
    for step in Step.objects.filter(task_id__in=list(steps)).order_by("position"):
        steps[step.task_id].append(step)
    holders = lease.holders(tasks)
    rows = []
    for task in tasks:
        plan = steps[task.pk]
        current = next((s for s in plan if s.state not in (StepState.DONE, StepState.FAILED)), None)
        done = sum(1 for s in plan if s.state == StepState.DONE or s.waived)
        rows.append(Progress(task, done, len(plan), current, holders.get(task.pk)))
    return rows


def recent() -> list[Task]:
    return list(Task.objects.filter(state__in=FINISHED).order_by("-updated_at", "-id")[:RECENT])


def home(*, can_act: bool, with_banner: bool = True) -> dict[str, Any]:
    questions = needs_you()
    context: dict[str, Any] = {
        "can_act": can_act,
        "questions": questions,
        "waiting": len(questions),
        "running": progress(),
        "recent": recent(),
    }
    if with_banner:
        context["problems"] = health.problems()
    return context


def step_view(step: Step, effects: list[Effect], *, current: bool = False) -> StepView:
    return StepView(
        step=step,
        effects=effects,
        question=question_of(step, effects),
        output=pretty(step.output),
        current=current,
        receipts=[(e, pretty(e.response), questions.of_effect(e)) for e in effects],
    )


def step_views(task: Task, only: set[int] | None = None) -> list[StepView]:
    """Every step of the task in plan order, or only the steps with ids in `only`."""
    current = task.steps.open().values_list("pk", flat=True).first()
    chosen = list(task.steps.order_by("position"))
    if only is not None:
        chosen = (
            [s for s in chosen if s.pk in only]
            if len(only) > 50
            else list(task.steps.filter(pk__in=only).order_by("position"))
        )
    effects = _effects_by_step([s.pk for s in chosen])
    return [step_view(s, effects[s.pk], current=s.pk == current) for s in chosen]


@dataclass
class JournalRow:
    event: Event
    step_key: str
    details: str


def journal_rows(events: list[Event]) -> list[JournalRow]:
    keys = dict(
        Step.objects.filter(pk__in={e.step_id for e in events if e.step_id}).values_list(
            "pk", "key"
        )
    )
    rows = []
    for event in events:
        data = {k: v for k, v in event.data.items() if v not in ("", None, [], {})}
        details = ", ".join(f"{k}={_short(v)}" for k, v in data.items())
        rows.append(JournalRow(event, keys.get(event.step_id or 0, ""), details))
    return rows


def _short(value: Any, limit: int = 120) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def task_timeline(task: Task) -> timeline.Timeline:
    steps = list(task.steps.order_by("position").values_list("pk", "key"))
    marks = (
        timeline.Mark(kind, step_id, at, actor)
        for kind, step_id, at, actor in Event.objects.filter(
            task=task, kind__in=timeline.LIFECYCLE
        ).values_list("kind", "step_id", "created_at", "actor")
    )
    return timeline.build(steps, marks, timezone.now())


def task_head(task: Task, *, can_act: bool) -> dict[str, Any]:
    """What the task page's head shows: the task, and who holds it now (worker or agent)."""
    return {"can_act": can_act, "task": task, "holder": lease.holder(task)}


def task_page(task: Task, *, can_act: bool) -> dict[str, Any]:
    events = list(Event.objects.filter(task=task).order_by("-id")[:JOURNAL_ROWS])
    return {
        **task_head(task, can_act=can_act),
        "steps": step_views(task),
        "journal": journal_rows(events),
        "timeline": task_timeline(task),
        "waiting": waiting_count(),
        "open_keys": list(
            task.steps.filter(state=StepState.PENDING)
            .order_by("position")
            .values_list("key", flat=True)
        ),
        "all_keys": list(task.steps.order_by("position").values_list("key", flat=True)),
    }
