"""The Tasks page: every task, newest first, found by words and filtered by state, origin,
schedule and date (`loop.task_search`, which the API and the `tasks` command share)."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.db.models import Count, Q
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils.http import urlencode
from django.views.decorators.http import require_http_methods

from ... import task_search
from ...models import TASK_STATE_WORDS, Schedule, Step, StepState, TaskState
from . import context


@login_required
@require_http_methods(["GET", "HEAD"])
def tasks_page(request: HttpRequest) -> HttpResponse:
    """A bad filter shows the page again with the error beside it (400), and no tasks."""
    error = None
    try:
        filters = task_search.parse(request.GET)
        found = task_search.search(filters)
    except task_search.FilterError as exc:
        error = exc
        filters = (
            task_search.parse(
                {
                    k: v
                    for k, v in request.GET.items()
                    if k in task_search.FIELDS and k != exc.field
                },
                strict=False,
            )
            if exc.field in task_search.FIELDS
            else task_search.Filters()
        )
        found = task_search.Found(filters, [], 0, dict.fromkeys(TaskState.values, 0))
    ids = [t.pk for t in found.tasks]
    steps = (
        Step.objects.filter(task_id__in=ids)
        .order_by()
        .values("task_id")
        .annotate(
            total=Count("id"),
            done=Count("id", filter=Q(state=StepState.DONE)),
            failed=Count("id", filter=Q(state=StepState.FAILED, waived=False)),
        )
    )
    progress = {row["task_id"]: row for row in steps}
    rows = [(t, progress.get(t.pk, {"total": 0, "done": 0, "failed": 0})) for t in found.tasks]

    def link(**changes: object) -> str:
        query = filters.query(**changes)
        return "?" + urlencode(query) if query else "?"

    states = [
        (state, label, found.counts.get(state, 0), link(state=state, page=1))
        for state, label in TASK_STATE_WORDS.items()
    ]
    return render(
        request,
        "loop/tasks.html",
        {
            "found": found,
            "filters": filters,
            "rows": rows,
            "states": states,
            "all_count": sum(found.counts.values()),
            "all_link": link(state="", page=1),
            "origins": [(k, label) for k, (label, _) in task_search.ORIGINS.items()],
            "schedules": list(Schedule.objects.order_by("name").values_list("pk", "name")),
            "error": error,
            "previous": link(page=filters.page - 1) if filters.page > 1 else "",
            "next": link(page=filters.page + 1) if filters.page < found.pages else "",
            "waiting": context.waiting_count(),
        },
        status=400 if error else 200,
    )
