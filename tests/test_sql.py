"""The hot statements of loop.sql read and write rows exactly as the ORM would, and follow the
models' own rules: what the claim takes is what `Task.objects.claimable()` finds, and each
task's first open step is the first of `Step.objects.open()`."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import transaction
from django.forms.models import model_to_dict
from django.test import override_settings
from django.utils import timezone

from loop import lease, open_steps, sql
from loop.models import Effect, Step, StepState, Task, TaskState
from loop.worker import Worker

from .conftest import make_task, step


def test_a_loaded_row_equals_the_orms(db: None) -> None:
    task = make_task(step("a", args={"value": {"nested": [1, "two", None]}}))
    Step.objects.filter(task=task).update(output={"x": 1.5}, started_at=timezone.now())
    orm = Step.objects.get(task=task)
    loaded = sql.load(Step, "task_id = %s", [task.pk])
    assert loaded is not None and model_to_dict(loaded) == model_to_dict(orm)
    assert sql.load(Step, "task_id = %s", [task.pk + 1000]) is None


def test_update_and_insert_write_what_the_orm_reads_back(db: None) -> None:
    task = make_task(step("a"))
    a = task.steps.get()
    later = timezone.now() + timedelta(minutes=5)
    with transaction.atomic():
        changed = sql.update(
            Step,
            {"output": {"ok": [True]}, "retry_at": later, "error": "", "attempts": 2},
            {"id": a.pk, "state": "pending", "finished_at": None},
        )
        assert changed == 1
        assert sql.update(Step, {"attempts": 3}, {"id": a.pk, "state": "done"}) == 0
        [intent] = sql.create_many(
            Effect,
            [
                {
                    "id": "e" * 64,
                    "task": task,
                    "step": a,
                    "tool": "http.post",
                    "request": {"json": [1, "two", None]},
                    "lease_until": later,
                }
            ],
        )
    a.refresh_from_db()
    assert (a.output, a.retry_at, a.attempts) == ({"ok": [True]}, later, 2)
    effect = Effect.objects.get(pk="e" * 64)
    assert model_to_dict(effect) == model_to_dict(intent)
    assert (effect.task_id, effect.step_id, effect.request, effect.lease_until) == (
        task.pk,
        a.pk,
        {"json": [1, "two", None]},
        later,
    )
    assert Task.objects.filter(pk=task.pk, lease_owner__isnull=True).exists()


def test_the_claim_takes_exactly_what_the_orm_calls_claimable(db: None) -> None:
    now = timezone.now()
    tasks = [make_task(step("a"), title=f"t{n}") for n in range(6)]
    Task.objects.update(state=TaskState.RUNNING)
    free, ran_out, held, waiting, due, paused = tasks
    Task.objects.filter(pk=ran_out.pk).update(lease_owner=7, lease_until=now - timedelta(1))
    Task.objects.filter(pk=held.pk).update(lease_owner=7, lease_until=now + timedelta(1))
    Task.objects.filter(pk=waiting.pk).update(run_after=now + timedelta(1))
    Task.objects.filter(pk=due.pk).update(run_after=now - timedelta(1))
    Task.objects.filter(pk=paused.pk).update(state=TaskState.PAUSED)
    claimable = set(Task.objects.claimable().values_list("pk", flat=True))
    assert claimable == {free.pk, ran_out.pk, due.pk}
    assert lease.any_claimable()
    with transaction.atomic():
        claimed = lease.claim_many(99, 10)
    assert {task_id for task_id, _ in claimed} == claimable
    assert not Task.objects.claimable().exists()
    assert not lease.any_claimable()
    # An agent's `next` takes a task it holds already, never one another holds.
    assert lease.claim_task(held.pk, 7, seconds=60) is not None
    assert lease.claim_task(held.pk, 8, seconds=60) is None
    assert lease.claim_task(waiting.pk, 8, seconds=60) is None


def test_first_open_is_the_first_of_step_objects_open(db: None) -> None:
    tasks = [make_task(*(step(f"s{n}") for n in range(5)), title=f"t{k}") for k in range(4)]
    states = [
        [StepState.DONE, StepState.FAILED, StepState.PENDING, StepState.PENDING, StepState.DONE],
        [StepState.DONE, StepState.BLOCKED, StepState.RUNNING, StepState.DONE, StepState.DONE],
        [StepState.DONE, StepState.DONE, StepState.FAILED, StepState.DONE, StepState.FAILED],
        [
            StepState.RUNNING,
            StepState.PENDING,
            StepState.PENDING,
            StepState.PENDING,
            StepState.DONE,
        ],
    ]
    for task, row in zip(tasks, states, strict=True):
        for n, state in enumerate(row):
            Step.objects.filter(task=task, key=f"s{n}").update(state=state)
    ids = [task.pk for task in tasks]
    found = open_steps.first_open(ids)
    expected = {
        task.pk: first
        for task in tasks
        if (first := Step.objects.filter(task=task).open().first()) is not None
    }
    assert {t: s.pk for t, s in found.items()} == {t: s.pk for t, s in expected.items()}
    assert {t: s.key for t, s in found.items()} == {
        tasks[0].pk: "s2",
        tasks[1].pk: "s1",
        tasks[3].pk: "s0",
    }


AWKWARD = ['say "hi"', "back\\slash", "{braces, and commas}", "NULL", "", "ünïcødé ✓", "a\nb"]


def test_many_rows_in_one_statement_keep_every_value_as_it_was(db: None) -> None:
    """A batch's rows go in one statement (on PostgreSQL as one array per column): text that
    looks like array syntax, quotes, backslashes, NULL-looking words and JSON come back
    unchanged, and a real None stays None."""
    task = make_task(*(step(f"s{n}") for n in range(len(AWKWARD))))
    steps = list(task.steps.order_by("position"))
    with transaction.atomic():
        changed = sql.update_many(
            Step,
            [
                {"error": text, "output": {"text": text, "list": [text, None]}, "retry_at": None}
                for text in AWKWARD
            ],
            [{"id": s.pk, "state": "pending"} for s in steps],
        )
        sql.create_many(
            Effect,
            [
                {"id": f"{n:064d}", "task": task, "step": s, "tool": "http.post"}
                | {"target": text, "summary": text, "request": {"t": text}}
                for n, (s, text) in enumerate(zip(steps, AWKWARD, strict=True))
            ],
        )
    assert changed == len(AWKWARD)
    for s, text in zip(steps, AWKWARD, strict=True):
        s.refresh_from_db()
        assert (s.error, s.output, s.retry_at) == (text, {"text": text, "list": [text, None]}, None)
    assert [(e.target, e.request) for e in Effect.objects.order_by("id")] == [
        (text, {"t": text}) for text in AWKWARD
    ]


def test_on_postgresql_the_hot_statements_are_prepared_once_per_connection(
    worker: Worker,
) -> None:
    """On PostgreSQL a tick's statements are prepared on the worker's connection the first
    time and reused after: more tasks, claimed together, add no prepared statement but a
    claim of another count (a list of ids is one array parameter, whatever its length). With
    LOOP_PG_PREPARE off nothing is prepared."""
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("prepared statements are PostgreSQL's")

    def prepared() -> set[str]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT statement FROM pg_prepared_statements")
            return {row[0] for row in cursor.fetchall()}

    for n in range(2):
        make_task(*(step(f"s{k}") for k in range(3)), title=f"first {n}")
    while worker.tick():
        pass
    first = prepared()
    assert any("loop_event" in s for s in first) and any("loop_step" in s for s in first)
    for n in range(3):
        make_task(*(step(f"s{k}") for k in range(3)), title=f"more {n}")
    while worker.tick():
        pass
    # Only a claim of another count is new (the count is written into the claim: one
    # statement per count, at most LOOP_BATCH of them).
    new = prepared() - first
    assert all(s.startswith('UPDATE "loop_task" SET "lease_owner"') for s in new), new
    assert Task.objects.filter(state=TaskState.DONE).count() == 5

    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")
    with override_settings(LOOP_PG_PREPARE=False):
        make_task(step("a"), title="unprepared")
        while worker.tick():
            pass
    assert prepared() == set()
    assert Task.objects.filter(state=TaskState.DONE).count() == 6


def test_an_idle_workers_look_reads_the_claim_index_not_the_finished_tasks(db: None) -> None:
    """The look before a claim (sql.any_claimable) seeks task_claim for the claimable states;
    thousands of finished tasks are never scanned."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from .test_big_tasks import plan_of

    Task.objects.bulk_create(
        [Task(title=f"t{n}", state=TaskState.DONE, lease_epoch=1) for n in range(3000)]
    )
    make_task(step("a"), title="runnable")
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE loop_task")
    with CaptureQueriesContext(connection) as captured:
        assert lease.any_claimable()
    [look] = [q["sql"] for q in captured.captured_queries]
    plan = plan_of(look)
    assert "task_claim" in plan, plan
    assert "SCAN loop_task" not in plan and "Seq Scan" not in plan, plan


def test_on_postgresql_the_plan_kept_for_each_hot_statement_reads_indexes(
    worker: Worker,
) -> None:
    """A prepared statement's plan may be planned once for every call, not knowing its values
    (a generic plan). For every statement of a worker's ticks, that plan reads the tasks and
    steps it needs through an index, with thousands of finished tasks and steps about and
    thousands of running ones that other workers hold."""
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("prepared statements are PostgreSQL's")
    held = timezone.now() + timedelta(hours=1)
    old = Task.objects.bulk_create(
        [Task(title=f"old {n}", state=TaskState.DONE, lease_epoch=1) for n in range(3000)]
        + [
            Task(title=f"busy {n}", state=TaskState.RUNNING, lease_owner=7, lease_until=held)
            for n in range(3000)
        ]
    )
    Step.objects.bulk_create(
        [
            Step(task=t, position=p, key=f"s{p}", tool="echo", state=StepState.DONE)
            for t in old
            for p in range(3)
        ]
    )
    for n in range(3):
        make_task(*(step(f"s{k}") for k in range(3)), title=f"runnable {n}")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE loop_task")
        cursor.execute("ANALYZE loop_step")
    ran: dict[str, list[object]] = {}

    def keep(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        if isinstance(params, list | tuple) and "%" in sql:
            ran.setdefault(sql, list(params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(keep):
        while worker.tick():
            pass
    assert Task.objects.filter(state=TaskState.DONE).count() == 3003  # the three runnable
    hot = {sql: params for sql, params in ran.items() if "loop_task" in sql or "loop_step" in sql}
    assert any(sql.startswith("UPDATE") for sql in hot) and any("unnest" in sql for sql in hot)
    with connection.cursor() as cursor:
        cursor.execute("SET plan_cache_mode = force_generic_plan")
        try:
            for n, (sql, params) in enumerate(hot.items()):
                marks = iter(range(1, len(params) + 1))
                text = re.sub(r"%[sb]", lambda _: f"${next(marks)}", sql)
                cursor.execute(f"PREPARE hot{n} AS {text}")
                values = ", ".join(["%s"] * len(params))
                cursor.execute(f"EXPLAIN EXECUTE hot{n}({values})", params)
                plan = "\n".join(row[0] for row in cursor.fetchall())
                assert not re.search(r"Seq Scan on loop_(task|step)\b", plan), (sql, plan)
        finally:
            cursor.execute("DEALLOCATE ALL")
            cursor.execute("RESET plan_cache_mode")
