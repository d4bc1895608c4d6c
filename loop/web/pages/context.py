"""What the dashboard's templates show, read in one place so that a page and the live push
render the same partial from the same context (`loop/web/live.py` calls these too).

Read-only: nothing here writes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db import connection
from django.db.models import Max
from django.utils import timezone

from ... import actions, goals, health, lease, open_steps, plans, questions, transcript
from ...models import (
    ENDED_TASK_STATES,
    Effect,
    Event,
    EventKind,
    Step,
    StepState,
    Task,
    TaskState,
)
from ...tools.shown import pretty
from .. import journal_words, timeline
from . import transcript_view

JOURNAL_ROWS = 200
STEP_WINDOW = 50  # steps a task page shows at once
RECENT = 8


@dataclass
class Progress:
    task: Task
    done: int
    total: int
    current: Step | None
    holder: lease.Holder | None = None
    plan_waits: bool = False  # Pippa's plan waits for Dad's approval (LOOP_CONFIRM_PLANS)

    @property
    def percent(self) -> int:
        return round(100 * self.done / self.total) if self.total else 0


@dataclass
class StepView:
    step: Step
    effects: list[Effect]
    question: questions.Question | None
    output: str
    current: bool = False
    # Each effect with its receipt and its request in full.
    receipts: list[tuple[Effect, str, questions.Request]] = field(default_factory=list)
    # Why it ran without asking, when a schedule's standing authorization let it (§10): the
    # rule of its latest `side_effect_auto_confirmed`, e.g. "confirm_before, run 3".
    standing: str = ""
    # A model step's conversation, its latest entries (transcript_view.SHOWN); None otherwise.
    transcript: transcript_view.Transcript | None = None
    # A failed step Dad may retry or skip: the steps that skipping it would break.
    recovery: Recovery | None = None
    # A side-effect step still to run: its call as the question will show it.
    preview: questions.Request | None = None

    @property
    def unfolded(self) -> bool:
        """Shown open: the step running, asking, or failed and waiting for Dad."""
        return (
            self.current
            or self.recovery is not None
            or self.step.state
            in (
                StepState.RUNNING,
                StepState.BLOCKED,
            )
        )


@dataclass
class Recovery:
    """A failed step of an open task, as "Needs you" shows it: Retry, or Skip naming the steps
    still to run that use its output."""

    step: Step
    breaks: list[Step]

    @property
    def task(self) -> Task:
        return self.step.task


def recovery(step: Step) -> Recovery | None:
    if step.state != StepState.FAILED or step.waived or step.task.ended:
        return None
    return Recovery(step, actions.breaks_if_skipped(step))


def failed_steps() -> list[Recovery]:
    """The failed steps of open tasks that no retry or skip has answered (index step_failed)."""
    steps = Step.objects.filter(state=StepState.FAILED, waived=False).exclude(
        task__state__in=ENDED_TASK_STATES
    )
    return [
        Recovery(s, actions.breaks_if_skipped(s))
        for s in steps.select_related("task").order_by("task_id", "position")
    ]


def last_event_id() -> int:
    """Read before the page's content, so the page is at least as new as this id."""
    return Event.objects.aggregate(top=Max("id"))["top"] or 0


def trailing_window() -> int:
    """How many event ids below the highest seen may still commit (0: ids commit in order):
    what a page and the live feed (`loop/web/live.py`) both count as possibly late."""
    return 0 if connection.vendor == "sqlite" else 256


def seen_near(last: int) -> str:
    """The ids a page rendered now already reflects within the window where ids may still
    commit late (PostgreSQL), so its first live connection is not sent them again."""
    window = trailing_window()
    if not window:
        return ""
    ids = Event.objects.filter(id__gt=last - window, id__lte=last).values_list("id", flat=True)
    return ",".join(str(i) for i in ids)


def waiting_count() -> int:
    """What waits for Dad: the questions, and the proposals waiting for his approval."""
    failed = Step.objects.filter(state=StepState.FAILED, waived=False).exclude(
        task__state__in=ENDED_TASK_STATES
    )
    return Step.objects.blocked().count() + _proposing().count() + failed.count()


def _proposing() -> Any:
    """Paused tasks with proposed steps (index step_proposed), oldest first."""
    return (
        Task.objects.filter(state=TaskState.PAUSED, steps__proposed=True).distinct().order_by("id")
    )


@dataclass
class Proposal:
    """What Pippa or an agent proposed for a task, as Dad approves it: every step, and each
    side-effect call in full (what approving authorizes)."""

    task: Task
    steps: list[Step]
    calls: dict[int, questions.Request]  # step id -> its call in full (side-effect tool steps)
    first_plan: bool  # a goal's plan, or a plan an agent sent: nothing of the task ran yet

    @property
    def heading(self) -> str:
        return "May I run this plan?" if self.first_plan else "May I change the plan?"

    @property
    def by(self) -> str:
        return goals.proposer(self.steps)

    @property
    def rows(self) -> list[tuple[Step, questions.Request | None]]:
        return [(s, self.calls.get(s.pk)) for s in self.steps]

    @property
    def later(self) -> set[int]:
        """The side-effect steps whose call waits for an earlier output: asked when they run."""
        return {pk for pk in self.calls if plans.references(self.by_id[pk].args)}

    @property
    def by_id(self) -> dict[int, Step]:
        return {s.pk: s for s in self.steps}


def proposal_of(task: Task) -> Proposal | None:
    """The task's proposal waiting for approval, or None."""
    if task.state != TaskState.PAUSED:
        return None
    steps = goals.proposal(task)
    if not steps:
        return None
    calls = {s.pk: questions.of_step(s) for s in steps if s.side_effect and s.judge == "tool"}
    first = (
        not task.steps.exclude(pk__in=[s.pk for s in steps]).exclude(key=goals.PLAN_KEY).exists()
    )
    return Proposal(task, steps, calls, first)


def plans_waiting() -> list[Proposal]:
    """The proposals by Pippa or agents that wait for Dad's approval (LOOP_CONFIRM_PLANS)."""
    return [p for t in _proposing() if (p := proposal_of(t)) is not None]


def _effects_by_step(step_ids: list[int]) -> dict[int, list[Effect]]:
    found: dict[int, list[Effect]] = {sid: [] for sid in step_ids}
    for effect in Effect.objects.filter(step_id__in=step_ids).order_by("created_at", "id"):
        found[effect.step_id].append(effect)
    return found


def needs_you() -> list[questions.Question]:
    steps = list(Step.objects.blocked().select_related("task").order_by("task_id", "position"))
    effects = _effects_by_step([s.pk for s in steps])
    return [q for s in steps if (q := questions.question(s, effects[s.pk])) is not None]


def progress() -> list[Progress]:
    """Each active task's steps done of total and its current step: a few statements for all
    of them, through indexes (open_steps), never a read of their plans."""
    tasks = list(Task.objects.open().order_by("-id"))
    ids = [t.pk for t in tasks]
    counts = open_steps.counts(ids)
    current = open_steps.first_open(ids)
    holders = lease.holders(tasks, shown=True)
    return [
        Progress(
            t, *counts[t.pk], current.get(t.pk), holders.get(t.pk), goals.waits_for_approval(t)
        )
        for t in tasks
    ]


def recent() -> list[Task]:
    return list(
        Task.objects.filter(state__in=ENDED_TASK_STATES).order_by("-updated_at", "-id")[:RECENT]
    )


def home(*, can_act: bool, with_banner: bool = True) -> dict[str, Any]:
    asked = needs_you()
    plans = plans_waiting()
    failed = failed_steps()
    context: dict[str, Any] = {
        "can_act": can_act,
        "questions": asked,
        "plans": plans,
        "failed": failed,
        "waiting": len(asked) + len(plans) + len(failed),
        "running": progress(),
        "recent": recent(),
    }
    if with_banner:
        context["problems"] = health.banner()
    return context


def step_view(step: Step, effects: list[Effect], *, current: bool = False) -> StepView:
    return StepView(
        step=step,
        effects=effects,
        question=questions.question(step, effects),
        output=pretty(step.output),
        current=current,
        receipts=[(e, pretty(e.response), questions.of_effect(e)) for e in effects],
        recovery=recovery(step),
        preview=_preview(step),
    )


def _preview(step: Step) -> questions.Request | None:
    if step.state != StepState.PENDING or not step.side_effect or step.judge != "tool":
        return None
    return questions.of_step(step)


@dataclass
class Window:
    """The steps a task page shows: at most STEP_WINDOW of them, from a chosen position or
    around the current step, with the task's counts and where the neighbouring windows begin."""

    steps: list[Step]
    current: Step | None
    before: int  # how many steps come before the first one shown
    done: int
    total: int
    failed: int
    earlier: int | None  # the position the previous window starts at, if any
    later: int | None  # the position the next window starts at, if any

    @property
    def first(self) -> int:
        """The 1-based number of the first step shown."""
        return self.before + 1

    @property
    def last(self) -> int:
        return self.before + len(self.steps)

    @property
    def around_current(self) -> bool:
        return self.current is not None and any(s.pk == self.current.pk for s in self.steps)


def step_window(task: Task, start: int | None = None) -> Window:
    """The window of the task page: STEP_WINDOW steps from position `start`, or (by default)
    from a few before the current step. Every read seeks an index on (task, position)."""
    current = open_steps.first_open([task.pk]).get(task.pk)
    plan = task.steps.order_by("position")
    if start is None:
        anchor = current.position if current else None
        if anchor is None:  # finished: the end of the plan
            last = plan.values_list("position", flat=True).last()
            anchor = last if last is not None else 0
        back = list(
            plan.filter(position__lt=anchor)
            .order_by("-position")
            .values_list("position", flat=True)[: STEP_WINDOW // 5 if current else STEP_WINDOW - 1]
        )
        start = back[-1] if back else anchor
    steps = list(plan.filter(position__gte=start)[:STEP_WINDOW])
    first = steps[0].position if steps else start
    earlier = list(
        plan.filter(position__lt=first)
        .order_by("-position")
        .values_list("position", flat=True)[:STEP_WINDOW]
    )
    after = steps[-1].position if steps else first
    later = plan.filter(position__gt=after).values_list("position", flat=True).first()
    done, total = open_steps.counts([task.pk])[task.pk]
    failed = task.steps.filter(state=StepState.FAILED).count()  # step_failed: failures are few
    before = plan.filter(position__lt=first).count()  # an index-only count
    return Window(
        steps=steps,
        current=current,
        before=before,
        done=done,
        total=total,
        failed=failed,
        earlier=earlier[-1] if earlier else None,
        later=later,
    )


def step_views(
    task: Task, only: set[int] | None = None, window: Window | None = None
) -> list[StepView]:
    """The steps of the page's window (around the current one unless `window` is given), or
    only the steps with ids in `only`; with their effects and, for model steps, the latest
    entries of their transcripts."""
    if only is not None:
        current = open_steps.first_open([task.pk]).get(task.pk)
        chosen = list(task.steps.filter(pk__in=only).order_by("position"))
    else:
        window = window or step_window(task)
        current, chosen = window.current, window.steps
    effects = _effects_by_step([s.pk for s in chosen])
    current_id = current.pk if current else None
    views = [step_view(s, effects[s.pk], current=s.pk == current_id) for s in chosen]
    said = transcript_view.of_steps(chosen, effects)
    for view in views:
        view.transcript = said.get(view.step.pk)
    if task.origin_run_id is not None:
        passes = Event.objects.filter(
            task=task, kind=EventKind.SIDE_EFFECT_AUTO_CONFIRMED, step__in=[s.pk for s in chosen]
        ).order_by("id")
        why = {e.step_id: f"{e.data.get('rule')}, run {e.data.get('run')}" for e in passes}
        for view in views:
            view.standing = why.get(view.step.pk, "")
    return views


@dataclass
class JournalRow:
    event: Event
    step_key: str
    details: str

    @property
    def kind(self) -> str:
        return journal_words.kind(self.event.kind)

    @property
    def who(self) -> str:
        return journal_words.who(self.event.actor)


def journal_rows(events: list[Event]) -> list[JournalRow]:
    keys = dict(
        Step.objects.filter(pk__in={e.step_id for e in events if e.step_id}).values_list(
            "pk", "key"
        )
    )
    rows = []
    for event in events:
        details = journal_words.details(event.kind, event.data)
        rows.append(JournalRow(event, keys.get(event.step_id or 0, ""), details))
    return rows


def task_timeline(task: Task, window: Window | None = None) -> timeline.Timeline:
    """The timeline of the window's steps (around the current one unless given): their
    lifecycle events are read by step (index loop_event_step_id), not the task's journal."""
    window = window or step_window(task)
    steps = [(s.pk, s.key) for s in window.steps]
    marks = (
        timeline.Mark(kind, step_id, at, actor)
        for kind, step_id, at, actor in Event.objects.filter(
            step_id__in=[pk for pk, _ in steps], kind__in=timeline.LIFECYCLE
        )
        .order_by("id")
        .values_list("kind", "step_id", "created_at", "actor")
    )
    return timeline.build(steps, marks, timezone.now())


def task_head(task: Task, *, can_act: bool) -> dict[str, Any]:
    """What the task page's head shows: the task, who holds it now (worker or agent), and
    whether Pippa's plan of it waits for Dad's approval, and the tokens its model steps used
    (summed by the database)."""
    done, total = open_steps.counts([task.pk]).get(task.pk, (0, 0))
    failed = task.steps.filter(state=StepState.FAILED, waived=False).count()  # step_failed
    return {
        "can_act": can_act,
        "task": task,
        "counts": {"done": done, "total": total, "failed": failed, "left": total - done - failed},
        "holder": lease.holder(task, shown=True),
        "plan_waits": goals.waits_for_approval(task),
        "proposal": proposal_of(task),
        "tokens": transcript.task_usage(task.pk),
    }


def task_page(
    task: Task,
    *,
    can_act: bool,
    start: int | None = None,
    journal_step: int | None = None,
    journal_kind: str = "",
) -> dict[str, Any]:
    """`journal_step`, `journal_kind`: the journal shows only that step's events, or kind's."""
    chosen = Event.objects.filter(task=task)
    if journal_step is not None:
        chosen = chosen.filter(step_id=journal_step)
    if journal_kind:
        chosen = chosen.filter(kind=journal_kind)
    events = list(chosen.order_by("-id")[:JOURNAL_ROWS])
    window = step_window(task, start)
    return {
        **task_head(task, can_act=can_act),
        "window": window,
        "steps": step_views(task, window=window),
        "journal": journal_rows(events),
        "journal_filter": {"step": journal_step, "kind": journal_kind},
        "journal_kinds": sorted(journal_words.KINDS.items(), key=lambda kv: kv[1]),
        "journal_steps": list(task.steps.order_by("position").values_list("pk", "key")[:500]),
        "timeline": task_timeline(task, window),
        "waiting": waiting_count(),
        # "Add steps after": the steps shown that nothing after has started yet may be chosen;
        # the form checks a posted key against the whole plan.
        "all_keys": [s.key for s in window.steps],
    }
