"""Big tasks: a step costs the same whether its task has 10 steps or 10,000, and however many
big tasks run together. The lookups a step needs go through indexes (the plans show it on
SQLite and PostgreSQL), and the work per step — statements, and on SQLite the database
engine's own instructions — does not grow with the task's history. No timings."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from loop import actions, lease, open_steps, plans
from loop.models import Event, EventKind, Step, StepState, Task, TaskState
from loop.permissions import SYSTEM
from loop.sql import ROWS_AT_ONCE
from loop.worker import Worker

from .conftest import make_task, run_until_idle, step

pytestmark = pytest.mark.django_db(transaction=True)


def big_task(count: int, title: str = "big") -> Task:
    return make_task(*(step(f"s{n}") for n in range(count)), title=title)


def plan_of(sql: str) -> str:
    """The database's plan for `sql`, as text."""
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute(f"EXPLAIN QUERY PLAN {sql}")
            return "\n".join(str(row[-1]) for row in cursor.fetchall())
        cursor.execute(f"EXPLAIN {sql}")
        return "\n".join(row[0] for row in cursor.fetchall())


def full_scans_of_steps(plan: str) -> list[str]:
    """Lines of the plan that read loop_step without an index (or the primary key)."""
    if connection.vendor == "sqlite":
        # "SCAN loop_step" / "SCAN o": a scan; "SEARCH … USING INDEX": a seek.
        return [line for line in plan.splitlines() if re.search(r"\bSCAN (loop_step|o)\b", line)]
    return [line for line in plan.splitlines() if "Seq Scan on loop_step" in line]


def statements_of(action: Any) -> list[str]:
    with CaptureQueriesContext(connection) as captured:
        action()
    return [q["sql"] for q in captured.captured_queries if "loop_step" in q["sql"]]


@pytest.fixture
def half_done() -> Task:
    """A 2,000-step task whose first 1,990 steps are done (set up directly: the plans of the
    lookups, not the loop, are what these tests look at), next to a second such task."""
    tasks = [big_task(2000, title="first"), big_task(2000, title="second")]
    for task in tasks:
        Step.objects.filter(task=task, position__lt=1990).update(state=StepState.DONE)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE loop_step")
    return tasks[0]


def test_next_open_step_lookup_seeks_the_open_steps_index(half_done: Task) -> None:
    other = Task.objects.exclude(pk=half_done.pk).get()
    [sql] = statements_of(lambda: open_steps.first_open([half_done.pk, other.pk]))
    plan = plan_of(sql)
    assert "step_open" in plan, plan
    assert not full_scans_of_steps(plan), plan
    found = open_steps.first_open([half_done.pk, other.pk])
    assert [found[t].key for t in (half_done.pk, other.pk)] == ["s1990", "s1990"]


def test_following_a_task_reads_no_done_steps(half_done: Task) -> None:
    """follow() (after every chain of steps and at the task's end), the failed-step check
    and the dashboard's counts: each statement seeks an index."""
    Step.objects.filter(task=half_done, position__gte=1990).update(state=StepState.DONE)
    Step.objects.filter(task=half_done, position=5).update(state=StepState.FAILED)

    def follow() -> None:
        with transaction.atomic():
            actions.follow(Task.objects.get(pk=half_done.pk), actor="test")

    statements = statements_of(follow) + statements_of(lambda: open_steps.counts([half_done.pk]))
    assert len(statements) == 5, statements
    for sql in statements:
        plan = plan_of(sql)
        if "state" in sql:  # not the total, a count of all the task's steps
            assert not full_scans_of_steps(plan), (sql, plan)
    assert Task.objects.get(pk=half_done.pk).state == TaskState.FAILED  # s5 failed, not waived
    assert open_steps.counts([half_done.pk]) == {half_done.pk: (1999, 2000)}


def test_a_reference_reads_only_the_steps_it_names(half_done: Task) -> None:
    later = Step.objects.get(task=half_done, key="s1995")
    later.args = {"value": "${s7.value} and ${s8.value}"}
    Step.objects.filter(task=half_done, position__lt=1990).update(output={"value": "v"})
    [sql] = statements_of(lambda: plans.resolved_args(later))
    assert not full_scans_of_steps(plan_of(sql)), plan_of(sql)
    assert plans.resolved_args(later) == {"value": "v and v"}


def test_creating_a_big_task_inserts_its_steps_in_bulk(db: None) -> None:
    with CaptureQueriesContext(connection) as captured:
        task = big_task(2000)
    statements = [q["sql"] for q in captured.captured_queries]
    step_inserts = [sql for sql in statements if 'INSERT INTO "loop_step"' in sql]
    # multi-row statements of ROWS_AT_ONCE rows each, not one per row
    assert len(step_inserts) == -(-2000 // ROWS_AT_ONCE), step_inserts
    assert len(statements) <= 8 + len(step_inserts), statements
    assert list(task.steps.order_by("position").values_list("key", flat=True)) == [
        f"s{n}" for n in range(2000)
    ]
    assert all(s.pk for s in Step.objects.filter(task=task))


@contextmanager
def engine_work() -> Iterator[list[int]]:
    """On SQLite, the database engine's virtual-machine instructions run inside the block (in
    hundreds): the work its statements did, whatever their number."""
    done = [0]
    if connection.vendor != "sqlite":
        yield done
        return
    connection.ensure_connection()
    raw = connection.connection

    def tick() -> int:
        done[0] += 1
        return 0

    raw.set_progress_handler(tick, 100)
    try:
        yield done
    finally:
        raw.set_progress_handler(None, 0)


def run_two(count: int, settings: Any) -> tuple[float, float]:
    """Two `count`-step echo tasks run together by an in-process worker, to the end: the
    statements and the engine's work (SQLite) per step."""
    settings.LOOP_CHAIN_SECONDS = 3600  # one chain to the end: no timing in the counts
    tasks = [big_task(count, title="one"), big_task(count, title="two")]
    if connection.vendor == "postgresql":
        # Statistics as autovacuum would keep them (the half_done fixture does the same): with
        # none for the 4,000 new rows the planner's guesses make each statement about twice as
        # slow. The counts below are of statements, which no plan changes.
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE loop_step")
    runner = Worker(label="test", batch=8)
    runner.boot()
    statements = [0]

    def counted(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        statements[0] += 1
        return execute(sql, params, many, context)

    with connection.execute_wrapper(counted), engine_work() as work:
        run_until_idle(runner)
    for task in tasks:
        task.refresh_from_db()
        assert task.state == TaskState.DONE
        steps = list(task.steps.order_by("position"))
        assert [s.output for s in steps] == [{"value": f"s{n}"} for n in range(count)]
        assert {(s.state, s.attempts) for s in steps} == {(StepState.DONE, 1)}
        done_events = Event.objects.filter(task=task, kind=EventKind.STEP_DONE).count()
        assert done_events == count
    steps = 2 * count
    return statements[0] / steps, work[0] * 100 / steps


def test_two_big_tasks_run_with_the_same_work_per_step_as_small_ones(
    settings: Any, django_db_blocker: Any
) -> None:
    small_queries, small_work = run_two(10, settings)
    Task.objects.all().delete()
    big_queries, big_work = run_two(2000, settings)
    # A small task's per-step share of its claim and its end is the larger: the big task's
    # steps may cost no more than the small one's.
    print(
        f"per step: {small_queries:.2f} / {big_queries:.2f} statements, "
        f"{small_work:.0f} / {big_work:.0f} SQLite instructions (10 / 2,000 steps)"
    )
    assert big_queries <= small_queries, (big_queries, small_queries)
    if connection.vendor == "sqlite":
        assert big_work <= small_work * 1.5, (big_work, small_work)


# ---- what people see of a big task ---------------------------------------------------------


def _page_statements(client: Any, url: str) -> tuple[Any, int]:
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    return response, len(captured.captured_queries)


def test_the_task_page_shows_a_window_of_a_big_task_around_its_current_step(
    dad: Any, half_done: Task
) -> None:
    from django.test import Client

    from loop.web.pages.context import STEP_WINDOW

    client = Client()
    client.force_login(dad)
    small = big_task(3, title="small")
    _, small_statements = _page_statements(client, f"/tasks/{small.pk}")
    response, statements = _page_statements(client, f"/tasks/{half_done.pk}")
    assert response.status_code == 200
    html = response.content.decode()
    cards = re.findall(r'<li class="step state-\w+( current)?" id="step-(\d+)"', html)
    assert 0 < len(cards) <= STEP_WINDOW
    current = Step.objects.get(task=half_done, key="s1990")
    assert (" current", str(current.pk)) in cards
    assert "1990 of 2000 steps done" in html
    assert 'rel="prev"' in html and 'rel="next"' not in html  # s1980-s1999: the end
    assert statements <= small_statements + 2, (statements, small_statements)

    # Earlier windows, by position; a position that is no number is a 400.
    earlier = client.get(f"/tasks/{half_done.pk}?from=0")
    first_cards = re.findall(r'id="step-(\d+)" data-state="(\w+)"', earlier.content.decode())
    assert len(first_cards) == STEP_WINDOW
    assert {state for _, state in first_cards} == {"done"}
    assert "steps 1–50 of 2000" in earlier.content.decode()
    assert 'href="?from=50#steps" rel="next"' in earlier.content.decode()
    assert client.get(f"/tasks/{half_done.pk}?from=x").status_code == 400


def test_the_home_page_counts_a_big_task_without_reading_it(dad: Any, half_done: Task) -> None:
    from django.test import Client

    client = Client()
    client.force_login(dad)
    response, statements = _page_statements(client, "/")
    html = response.content.decode()
    assert html.count("1990 of 2000 steps done") == 2  # both big tasks
    assert "s1990" in html
    with CaptureQueriesContext(connection) as captured:
        client.get("/")
    for query in captured.captured_queries:
        # The steps' total is a count of them all (an index-only scan on SQLite); the rest
        # (done, failed, the current step) seek the partial indexes.
        if "loop_step" in query["sql"] and "state" in query["sql"]:
            assert not full_scans_of_steps(plan_of(query["sql"])), query["sql"]


def test_the_admin_draws_a_window_of_step_forms_and_saves_within_it(half_done: Task) -> None:
    from django.contrib.auth.models import User
    from django.test import Client

    from loop.web.pages.context import STEP_WINDOW

    from .test_admin_plan_edits import FormFields, form_index

    staff = User.objects.create_superuser("staff", "staff@localhost", "staff-password-1")
    client = Client()
    client.force_login(staff)
    response = client.get(f"/admin/loop/task/{half_done.pk}/change/")
    assert response.status_code == 200
    html = response.content.decode()
    parser = FormFields()
    parser.feed(html)
    form = parser.data
    ids = [v for k, v in form.items() if k.endswith("-id")]
    assert 0 < len(ids) <= STEP_WINDOW
    assert "of 2000 (1990 done)" in html and "?steps_from=" in html
    later = Step.objects.get(task=half_done, key="s1995")
    n = form_index(form, later)
    form[f"steps-{n}-title"] = "edited in a window"
    saved = client.post(f"/admin/loop/task/{half_done.pk}/change/", form)
    assert saved.status_code == 302, saved.content.decode()[:2000]
    assert Step.objects.get(pk=later.pk).title == "edited in a window"
    assert Event.objects.filter(kind=EventKind.STEP_EDITED, step=later).count() == 1


def test_steps_added_in_the_middle_of_a_big_task_move_the_rest_set_wise(db: None) -> None:
    task = big_task(2000)
    Step.objects.filter(task=task, position__lt=10).update(state=StepState.DONE)
    with CaptureQueriesContext(connection) as captured:
        actions.add_steps(
            task_id=task.pk, steps=[step("new1"), step("new2")], after="s10", actor="t", user=SYSTEM
        )
    assert len(captured.captured_queries) < 20, len(captured.captured_queries)
    keys = list(task.steps.order_by("position").values_list("key", flat=True))
    assert keys[:13] == [*(f"s{n}" for n in range(11)), "new1", "new2"]
    assert keys[13:] == [f"s{n}" for n in range(11, 2000)]
    assert list(task.steps.order_by("position").values_list("position", flat=True)) == list(
        range(2002)
    )


def test_the_claim_descends_the_claim_index_in_order_without_a_sort() -> None:
    """Many tasks, running, planning and done: the claim (planning and running tasks, in
    CLAIM_ORDER) reads them through task_claim in its order, never sorting every claimable
    task (models.CLAIMABLE_TASK, sql.claim_free_tasks)."""
    states = [TaskState.RUNNING] * 3000 + [TaskState.DONE] * 3000 + [TaskState.PLANNING] * 30
    Task.objects.bulk_create(
        [Task(title=f"t{n}", state=state, lease_epoch=n % 7) for n, state in enumerate(states)]
    )
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE loop_task")
    with CaptureQueriesContext(connection) as captured, transaction.atomic():
        claimed = lease.claim_many(99, 5)
    [sql] = [q["sql"] for q in captured.captured_queries if q["sql"].startswith("UPDATE")]
    plan = plan_of(sql)
    assert "task_claim" in plan, plan
    assert "TEMP B-TREE" not in plan and "Sort" not in plan, plan
    # planning tasks first, then running ones, least-claimed first
    tasks = {t.pk: t for t in Task.objects.filter(pk__in=[pk for pk, _ in claimed])}
    assert {tasks[pk].state for pk, _ in claimed} == {TaskState.PLANNING}
