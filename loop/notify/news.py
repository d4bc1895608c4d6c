"""What the journal says that Dad should hear of (DESIGN.md §17), as news: a question asked, a
plan waiting for approval, a task that failed, a worker found dead, a model endpoint down.

Read-only. A piece of news is read from the rows as they are when it is sent: a question
answered meanwhile, or a plan decided, is no news any more and is left out."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings
from django.urls import reverse
from django.utils import timezone

from .. import goals, health, questions
from ..models import Event, EventKind, QuestionKind, Step, Task, TaskState, Worker, Writer

NOTABLE = frozenset(
    {
        EventKind.STEP_BLOCKED,
        EventKind.STEPS_ADDED,
        EventKind.TASK_STATE,
        EventKind.WORKER_DEAD,
        EventKind.WORKER_PARKED,
        EventKind.MODEL_RETRY,
    }
)
MAX_ITEMS = 20  # a message lists at most this many; it says how many more there are


@dataclass(frozen=True)
class News:
    kind: str  # "question" | "reminder" | "plan" | "failed" | "worker" | "model"
    key: str  # one piece of news once per message, however many events tell it
    title: str  # one line
    lines: list[str] = field(default_factory=list)  # the rest, in full
    url: str = ""
    step_id: int | None = None

    def as_dict(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "title": self.title,
            "text": "\n".join(self.lines),
            "url": self.url,
            "step": self.step_id,
        }


def link(path: str) -> str:
    return settings.SITE_URL + path


def ago(then: datetime, now: datetime | None = None) -> str:
    """ "just now", "12 min ago", "3 h ago", "2 days ago"."""
    seconds = max(0, int(((now or timezone.now()) - then).total_seconds()))
    if seconds < 60:
        return "just now"
    if seconds < 3600:
        return f"{seconds // 60} min ago"
    if seconds < 2 * 86400:
        return f"{seconds // 3600} h ago"
    return f"{seconds // 86400} days ago"


def asked_event(step: Step) -> Event | None:
    """The journal row of the step's current question (its latest asking)."""
    return (
        Event.objects.filter(task_id=step.task_id, step_id=step.pk, kind=EventKind.STEP_BLOCKED)
        .order_by("-id")
        .first()
    )


def why(step: Step, question: questions.Question | None = None) -> str:
    """Why the question is asked, in Dad's words."""
    if step.question_kind == QuestionKind.DID_IT_HAPPEN:
        return "a crash: a try was cut off and whether its call went out is unknown"
    if question is not None and question.effects:
        return "a crash: the earlier try was cut off before its call went out"
    if step.judge == "model":
        return "Pippa chose this call while doing the step: her side effects wait for your answer"
    if step.writer == Writer.PIPPA:
        return "Pippa wrote this step: her side effects wait for your answer"
    if step.writer == Writer.AGENT:
        return f"an agent ({step.written_by}) wrote this step: its side effects wait for you"
    if step.writer == Writer.SCHEDULE:
        return (
            "a scheduled run: you wrote to Pippa since it began, which ends its standing permission"
        )
    if step.attempts <= 1:
        return "the first run of a step marked to ask before it runs"
    return "a step marked to ask before each run"


def question_news(step: Step, *, kind: str = "question") -> News | None:
    """The question of a step that still waits, in full, as its card shows it."""
    effects = list(step.effects.order_by("created_at", "id"))
    asked = questions.question(step, effects)
    if asked is None:
        return None
    task = step.task
    event = asked_event(step)
    lines = [
        f"Task: {task.title}",
        f"Step: {step.title or step.key} ({step.key})"
        + (f", attempt {step.attempts} of {step.max_attempts}" if step.attempts else ""),
        f"Written by: {step.written_by or step.get_writer_display()}",
        f"Why you are asked: {why(step, asked)}",
    ]
    if event is not None:
        lines.append(f"Asked: {ago(event.created_at)} ({event.created_at:%Y-%m-%d %H:%M UTC})")
    lines.extend(asked.already)
    for request in asked.requests:
        lines.append(f"{request.tool}{questions.ARROW}{request.target or '(no target)'}")
        if request.summary:
            lines.append(f"  {request.summary}")
        for f in request.fields:
            text = f.text if "\n" not in f.text else "\n    " + f.text.replace("\n", "\n    ")
            lines.append(f"  {f.label}: {text}")
    lines.extend(asked.notes)
    prefix = "Reminder — " if kind == "reminder" else ""
    return News(
        kind,
        f"question-{step.pk}",
        f"{prefix}{asked.heading} {task.title}: {step.title or step.key}",
        lines,
        link(reverse("loop:task", args=[task.pk])) + f"#step-{step.pk}",
        step.pk,
    )


def of_events(events: Iterable[Event]) -> list[News]:
    """The news these events tell, each piece once, as things stand now."""
    found: dict[str, News] = {}
    model_down: list[str] = []
    for event in events:
        news: News | None = None
        if event.kind == EventKind.STEP_BLOCKED and event.step_id:
            step = Step.objects.select_related("task").filter(pk=event.step_id).first()
            news = question_news(step) if step is not None else None
        elif event.kind == EventKind.STEPS_ADDED and event.task_id:
            task = Task.objects.filter(pk=event.task_id).first()
            if task is not None and goals.waits_for_approval(task):
                url = link(reverse("loop:home")) + f"#plan-waits-{task.pk}"
                news = News(
                    "plan",
                    f"plan-{task.pk}",
                    f"A plan waits for your approval: {task.title}",
                    ["Nothing of it runs until you approve it."],
                    url,
                )
        elif event.kind == EventKind.TASK_STATE and event.data.get("new") == TaskState.FAILED:
            task = Task.objects.filter(pk=event.task_id or 0).first()
            if task is not None:
                failed = task.steps.filter(state="failed").order_by("-position").first()
                lines = [f"Step {failed.key}: {failed.error}"] if failed and failed.error else []
                news = News(
                    "failed",
                    f"failed-{task.pk}",
                    f"Task failed: {task.title}",
                    lines,
                    link(reverse("loop:task", args=[task.pk])),
                )
        elif event.kind == EventKind.WORKER_DEAD:
            worker = Worker.objects.filter(pk=event.data.get("worker") or 0).first()
            name = str(worker) if worker else "a worker"
            news = News(
                "worker",
                f"worker-{event.pk}",
                f"{name} stopped answering and was found dead",
                [
                    "Its work was handed on. If no worker is left: run bin/up again, or restart "
                    "the worker service."
                ],
                link(reverse("loop:home")),
            )
        elif event.kind == EventKind.WORKER_PARKED and event.data.get("reason"):
            reason = str(event.data["reason"])
            news = News(
                "worker",
                f"parked-{event.actor}",
                f"A worker stopped taking new work: {reason}",
                [health.remedy(reason) or health.remedy(" is parked")],
                link(reverse("loop:home")),
            )
        elif event.kind == EventKind.MODEL_RETRY:
            model_down.append(str(event.data.get("reason", "")))
        if news is not None:
            found[news.key] = news
    if model_down:
        found["model"] = News(
            "model",
            "model",
            "The model endpoint is not answering",
            [f"{len(model_down)} call(s) retried; the last said: {model_down[-1]}"],
            link(reverse("loop:home")),
        )
    return list(found.values())
