from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db.models import Count

from loop import task_search
from loop.management.base import LoopCommand
from loop.models import Step, StepState
from loop.serialize import task_summary


class Command(LoopCommand):
    help = (
        "List tasks, newest first: every one, or those the filters match (the same filters as "
        "the Tasks page and GET /api/tasks). --page shows one page of "
        f"{task_search.PAGE_SIZE}; --counts the number in each state."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true")
        parser.add_argument("--q", default="", help="words in titles, step titles or outputs")
        parser.add_argument("--state", default="", help="a task state")
        parser.add_argument("--origin", default="", help=", ".join(task_search.ORIGINS))
        parser.add_argument("--schedule", default="", help="a schedule's id")
        parser.add_argument("--since", default="", help="created on or after, YYYY-MM-DD")
        parser.add_argument("--until", default="", help="created on or before, YYYY-MM-DD")
        parser.add_argument("--page", default="", help="one page of results")
        parser.add_argument("--counts", action="store_true", help="how many in each state")

    def handle(self, *args: Any, **options: Any) -> None:
        params = {name: options[name] for name in task_search.FIELDS}
        try:
            filters = task_search.parse(params)
            size = task_search.PAGE_SIZE if options["page"] else task_search.MAX_PAGE
            found = task_search.search(filters, page_size=size)
        except task_search.FilterError as exc:
            raise CommandError(str(exc)) from None
        if options["counts"]:
            if options["json"]:
                self.stdout.write(json.dumps(found.counts, indent=2))
            else:
                for state, n in found.counts.items():
                    self.stdout.write(f"{state:<10} {n}")
            return
        if options["json"]:
            self.stdout.write(json.dumps([task_summary(t) for t in found.tasks], indent=2))
            return
        ids = [t.pk for t in found.tasks]
        done = _count(ids, state=StepState.DONE)
        total = _count(ids)
        for task in found.tasks:
            self.stdout.write(
                f"{task.pk:>6}  {task.state:<10} {done.get(task.pk, 0)}/{total.get(task.pk, 0)}"
                f"  {task.title}"
            )
        if options["page"]:
            self.stderr.write(f"page {filters.page} of {found.pages} ({found.total} tasks)")


def _count(ids: list[int], **where: Any) -> dict[int, int]:
    """Steps per task, 500 tasks a statement (a statement's variables are bounded)."""
    counted: dict[int, int] = {}
    for at in range(0, len(ids), 500):
        rows = (
            Step.objects.filter(task_id__in=ids[at : at + 500], **where)
            .order_by()
            .values("task_id")
            .annotate(n=Count("id"))
        )
        counted.update({row["task_id"]: row["n"] for row in rows})
    return counted
