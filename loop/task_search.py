"""Finding tasks: one reading of the filters (`parse`) and one query (`search`), shared by the
dashboard's Tasks page, `GET /api/tasks` and the `tasks` command.

Filters, each optional: `q` (words in a task's title, its steps' titles or outputs), `state` (a
task state), `origin` (where the task came from, `ORIGINS`), `schedule` (a schedule's id),
`since` / `until` (dates, YYYY-MM-DD, in the site's time zone, both days included), `page`.
A bad value is a `FilterError` naming its field. Newest first.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from typing import Any

from django.db.models import Count, Exists, OuterRef, Q, QuerySet, TextField
from django.db.models.functions import Cast
from django.utils import timezone

from . import goals, numbers
from .models import Origin, Step, Task, TaskState

PAGE_SIZE = 25
MAX_QUERY = 200
MAX_PAGE = 1_000_000

# Where a task came from, as Dad names it, and the rule that says so.
ORIGINS: dict[str, tuple[str, Q]] = {
    "dashboard": ("the dashboard", Q(origin=Origin.DASHBOARD)),
    "schedule": ("a schedule", Q(origin=Origin.SCHEDULE)),
    "pippa": (
        "Pippa (from a goal)",
        Q(Exists(Step.objects.filter(task=OuterRef("pk"), key=goals.PLAN_KEY))),
    ),
    "agent": ("an agent", Q(origin=Origin.API) & ~Q(driver="")),
    "api": ("the API", Q(origin=Origin.API, driver="")),
    "plan": ("a plan file", Q(origin=Origin.PLAN)),
}
FIELDS = ("q", "state", "origin", "schedule", "since", "until", "page")


class FilterError(ValueError):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True)
class Filters:
    q: str = ""
    state: str = ""
    origin: str = ""
    schedule: int | None = None
    since: date | None = None
    until: date | None = None
    page: int = 1

    def query(self, **changes: Any) -> dict[str, str]:
        """These filters (with `changes`) as query parameters, the empty ones left out."""
        values = {**self.__dict__, **changes}
        return {
            k: str(v) for k, v in values.items() if v not in ("", None) and (k, v) != ("page", 1)
        }


def parse(params: Any, *, strict: bool = True) -> Filters:
    """The filters in `params` (a QueryDict or a mapping of strings); FilterError naming the
    first bad one. `strict`: an unknown parameter is refused too."""
    if strict:
        unknown = sorted(set(params) - set(FIELDS))
        if unknown:
            raise FilterError(unknown[0], f"not a filter (the filters: {', '.join(FIELDS)})")

    def text(name: str) -> str:
        value = params.get(name) or ""
        return value.strip() if isinstance(value, str) else str(value)

    q = text("q")
    if len(q) > MAX_QUERY:
        raise FilterError("q", f"at most {MAX_QUERY} characters")
    state = text("state")
    if state and state not in TaskState.values:
        raise FilterError("state", f"must be one of {', '.join(TaskState.values)}")
    origin = text("origin").lower()
    if origin and origin not in ORIGINS:
        raise FilterError("origin", f"must be one of {', '.join(ORIGINS)}")
    schedule = _whole(text("schedule"), "schedule", 1) if text("schedule") else None
    since, until = _day(text("since"), "since"), _day(text("until"), "until")
    if since and until and since > until:
        raise FilterError("until", "is before since")
    page = _whole(text("page"), "page", 1) if text("page") else 1
    return Filters(q, state, origin, schedule, since, until, page)


def _whole(value: str, name: str, low: int) -> int:
    try:
        return numbers.whole(value, name, low=low, high=MAX_PAGE)
    except numbers.NotANumber as exc:
        raise FilterError(name, "must be a whole number" + (f" from {low}" if low else "")) from (
            exc
        )


def _day(value: str, name: str) -> date | None:
    if not value:
        return None
    try:
        return date.fromisoformat(value) if len(value) == 10 else _bad_day(name)
    except ValueError:
        return _bad_day(name)


def _bad_day(name: str) -> date:
    raise FilterError(name, "must be a date, YYYY-MM-DD")


def _start_of(day: date) -> datetime:
    return timezone.make_aware(datetime.combine(day, time.min))


def _matching(filters: Filters, *, with_state: bool = True) -> QuerySet[Task]:
    tasks = Task.objects.all()
    if filters.q:
        words = Step.objects.annotate(shown=Cast("output", TextField())).filter(
            Q(title__icontains=filters.q) | Q(shown__icontains=filters.q), task=OuterRef("pk")
        )
        tasks = tasks.filter(Q(title__icontains=filters.q) | Q(Exists(words)))
    if with_state and filters.state:
        tasks = tasks.filter(state=filters.state)
    if filters.origin:
        tasks = tasks.filter(ORIGINS[filters.origin][1])
    if filters.schedule is not None:
        tasks = tasks.filter(origin_run__schedule_id=filters.schedule)
    if filters.since:
        tasks = tasks.filter(created_at__gte=_start_of(filters.since))
    if filters.until:
        tasks = tasks.filter(created_at__lt=_start_of(filters.until + timedelta(days=1)))
    return tasks


@dataclass
class Found:
    filters: Filters
    tasks: list[Task]
    total: int
    counts: dict[str, int]  # per state, under every filter but the state

    @property
    def pages(self) -> int:
        return max(1, -(-self.total // PAGE_SIZE))


def search(filters: Filters, *, page_size: int = PAGE_SIZE) -> Found:
    """The page `filters.page` of the matching tasks, newest first; FilterError naming `page`
    past the last page (a page of none is the first)."""
    tasks = _matching(filters)
    total = tasks.count()
    if filters.page > 1 and (filters.page - 1) * page_size >= total:
        raise FilterError("page", f"there are {max(1, -(-total // page_size))} pages")
    start = (filters.page - 1) * page_size
    rows = list(tasks.order_by("-created_at", "-id")[start : start + page_size])
    grouped = (
        _matching(filters, with_state=False).order_by().values("state").annotate(n=Count("id"))
    )
    counts = dict.fromkeys(TaskState.values, 0)
    counts.update({row["state"]: row["n"] for row in grouped})
    return Found(filters, rows, total, counts)
