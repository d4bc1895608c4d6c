"""The management commands as a user or a script runs them (DESIGN.md §13): child processes,
their stdout (JSON a script may rely on), their stderr and their exit status. A command that
did not do what it was asked exits non-zero with the reason on stderr, and no traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.db import connection

from loop.models import Event, Step, Task

from .conftest import ROOT, make_task, process_env, step

# The children see what the test wrote; the commands' options and exits are tried on the
# SQLite run.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.sqlite_only]

PLAN = """
title: Say hello
steps:
  - key: greet
    title: Compose a greeting
    tool: echo
    args: {value: hello}
  - key: pay
    tool: http.post
    args: {url: "http://127.0.0.1:9/pay", json: {amount: 1}}
    side_effect: true
    confirm_before: true
"""


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        capture_output=True,
        text=True,
        env=process_env(),
        timeout=120,
    )


def succeeds(*args: str) -> str:
    result = run(*args)
    assert result.returncode == 0, result.stderr
    return result.stdout


def fails(*args: str) -> str:
    """The command exits non-zero, says why on stderr without a traceback; its stderr."""
    result = run(*args)
    assert result.returncode != 0, result.stdout
    assert "CommandError: " in result.stderr or "error: " in result.stderr, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    return result.stderr


@contextmanager
def refusing(table: str, write: str) -> Iterator[None]:
    """Every `write` (INSERT or UPDATE) on `table` fails in the database itself, for every
    connection, as a broken disk or a read-only database would refuse it."""
    name = f"refuse_{write.lower()}_{table}"
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute(
                f"CREATE TRIGGER {name} BEFORE {write} ON {table} "
                f"BEGIN SELECT RAISE(ABORT, 'injected: {write} on {table} refused'); END"
            )
        else:
            cursor.execute(
                f"CREATE FUNCTION {name}() RETURNS trigger AS $$ BEGIN "
                f"RAISE EXCEPTION 'injected: {write} on {table} refused'; END $$ LANGUAGE plpgsql"
            )
            cursor.execute(
                f"CREATE TRIGGER {name} BEFORE {write} ON {table} "
                f"FOR EACH ROW EXECUTE FUNCTION {name}()"
            )
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            if connection.vendor == "sqlite":
                cursor.execute(f"DROP TRIGGER {name}")
            else:
                cursor.execute(f"DROP TRIGGER {name} ON {table}")
                cursor.execute(f"DROP FUNCTION {name}()")


# ---- plan --------------------------------------------------------------------------------------


def test_plan_prints_only_the_new_tasks_id(tmp_path: Path) -> None:
    plan = tmp_path / "hello.yaml"
    plan.write_text(PLAN)
    out = succeeds("plan", str(plan))
    task = Task.objects.get()
    assert out == f"{task.pk}\n"
    assert task.title == "Say hello" and task.state == "running"
    assert list(task.steps.order_by("position").values_list("key", flat=True)) == ["greet", "pay"]


def test_a_bad_plan_file_exits_nonzero_naming_the_field_and_creates_nothing(
    tmp_path: Path,
) -> None:
    plan = tmp_path / "bad.yaml"
    plan.write_text(PLAN.replace("tool: http.post", "tool: http.teleport"))
    assert "step 'pay': unknown tool 'http.teleport'" in fails("plan", str(plan))
    plan.write_text(PLAN.replace("title: Say hello\n", ""))
    assert "title: required" in fails("plan", str(plan))
    plan.write_text("title: [unclosed")
    assert "plan: not valid YAML" in fails("plan", str(plan))
    assert "No such file" in fails("plan", str(tmp_path / "missing.yaml"))
    assert not Task.objects.exists() and not Step.objects.exists()


def test_plan_exits_nonzero_when_the_database_refuses_and_leaves_nothing_half_made(
    tmp_path: Path,
) -> None:
    plan = tmp_path / "hello.yaml"
    plan.write_text(PLAN)
    with refusing("loop_step", "INSERT"):
        said = fails("plan", str(plan))
    assert "CommandError: database: " in said and "injected: INSERT on loop_step refused" in said
    assert not Task.objects.exists() and not Event.objects.exists()


# ---- tasks and task ----------------------------------------------------------------------------


def test_tasks_json_lists_id_title_and_state() -> None:
    first = make_task(step("a"), title="first")
    second = make_task(step("b"), title="second")
    listed = json.loads(succeeds("tasks", "--json"))
    assert listed == [  # newest first
        {"id": second.pk, "title": "second", "state": "running"},
        {"id": first.pk, "title": "first", "state": "running"},
    ]
    assert json.loads(succeeds("tasks", "--json")) == listed
    text = succeeds("tasks")
    assert "first" in text and "second" in text


def test_task_json_has_the_keys_scripts_rely_on(tmp_path: Path) -> None:
    plan = tmp_path / "hello.yaml"
    plan.write_text(PLAN)
    task_id = int(succeeds("plan", str(plan)))
    succeeds("runloop", "--once")  # greet runs
    succeeds("runloop", "--once")  # pay asks "May I do this?"
    shown = json.loads(succeeds("task", str(task_id), "--json"))
    assert {"id", "title", "state", "steps", "events"} <= set(shown)
    assert (shown["id"], shown["title"], shown["state"]) == (task_id, "Say hello", "blocked")
    greet, pay = shown["steps"]
    for one in (greet, pay):
        assert {
            "id",
            "key",
            "title",
            "state",
            "attempts",
            "side_effect",
            "output",
            "error",
            "question",
            "effects",
        } <= set(one)
    assert (greet["key"], greet["state"], greet["output"], greet["question"]) == (
        "greet",
        "done",
        {"value": "hello"},
        None,
    )
    assert (pay["state"], pay["side_effect"], pay["attempts"]) == ("blocked", True, 0)
    assert pay["question"]["kind"] == "may_i"
    assert {"kind", "text", "effects"} <= set(pay["question"])
    kinds = [e["kind"] for e in shown["events"]]
    assert kinds[0] == "task_created" and "step_done" in kinds and "step_blocked" in kinds
    for event in shown["events"]:
        assert set(event) >= {"id", "kind", "step", "actor", "at", "data"}
    assert [e["id"] for e in shown["events"]] == sorted(e["id"] for e in shown["events"])
    assert "pay" in succeeds("task", str(task_id))


def test_task_of_an_unknown_id_exits_nonzero() -> None:
    assert "id: no task 999999" in fails("task", "999999")
    assert "id: no task 999999" in fails("task", "999999", "--json")
    assert "id: must be a whole number" in fails("task", "seven")
    assert "id: must be a whole number" in fails("task", "١٢")  # int() would take it
    assert "id: must be a whole number" in fails("task", "9" * 20)  # past any row id


# ---- unblock -----------------------------------------------------------------------------------


def test_unblock_refuses_a_wrong_decision_or_a_step_that_is_not_blocked(tmp_path: Path) -> None:
    plan = tmp_path / "hello.yaml"
    plan.write_text(PLAN)
    task_id = int(succeeds("plan", str(plan)))
    succeeds("runloop", "--once")
    succeeds("runloop", "--once")
    greet = Step.objects.get(task_id=task_id, key="greet")
    pay = Step.objects.get(task_id=task_id, key="pay")
    assert "step 'greet' is done, not blocked" in fails("unblock", str(greet.pk), "--allow")
    assert 'does not answer "May I do this?"' in fails("unblock", str(pay.pk), "--happened")
    assert "one of the arguments" in fails("unblock", str(pay.pk))
    assert "not allowed with argument" in fails("unblock", str(pay.pk), "--allow", "--deny")
    assert Step.objects.get(pk=pay.pk).state == "blocked"
    assert not Event.objects.filter(kind="decision").exists()
    assert "is now failed" in succeeds("unblock", str(pay.pk), "--deny", "--note", "not today")


# ---- runloop --once ----------------------------------------------------------------------------


def test_runloop_once_exits_zero_after_a_tick_that_ran_a_step() -> None:
    task = make_task(step("a"), step("b"))
    succeeds("runloop", "--once")
    assert Step.objects.get(task=task, key="a").state == "done"
    succeeds("runloop", "--once")
    assert Task.objects.get(pk=task.pk).state == "done"
    succeeds("runloop", "--once")  # nothing to do is no failure


def test_runloop_once_exits_nonzero_when_its_tick_failed() -> None:
    task = make_task(step("a"))
    with refusing("loop_step", "UPDATE"):  # the start of the step cannot be written
        said = fails("runloop", "--once", "--worker-id", "cron")
    assert "CommandError: --once: the tick failed: write failed in task" in said
    assert "injected: UPDATE on loop_step refused" in said
    assert Step.objects.get(task=task).state == "pending"  # nothing reported that was not recorded
    succeeds("runloop", "--once")
    assert Step.objects.get(task=task).state == "done"


def test_runloop_once_exits_nonzero_when_boot_cannot_register_the_worker() -> None:
    with refusing("loop_worker", "INSERT"):
        said = fails("runloop", "--once")
    assert "CommandError: database: " in said and "loop_worker refused" in said


@pytest.mark.parametrize("unbuffered", ["1", ""])
def test_a_reader_that_stops_reading_ends_the_command_quietly(unbuffered: str) -> None:
    """`task ID | head`: the pipe closes before the command has written; no traceback."""
    task = make_task(*(step(f"s{i}", args={"value": "x" * 200}) for i in range(50)))
    env = process_env(PYTHONUNBUFFERED=unbuffered)
    child = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "task", str(task.pk)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert child.stdout is not None and child.stderr is not None
    child.stdout.close()  # the reader is gone before the first line
    stderr = child.stderr.read().decode()
    assert child.wait(timeout=60) == 141
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr
