"""Authority comes from a person (DESIGN.md §5, §6, §10; invariants 13 and 15), through real
`runloop` processes and the scripted model server: a read-only model step's revision waits for
Dad, a schedule's standing authorization covers only its template as Dad wrote it, and two
databases never send the same Idempotency-Key to a receiver that deduplicates on it."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from loop import goals, plans, schedules
from loop.models import Effect, Event, EventKind, Schedule, Step, Task, TaskState
from loop.permissions import SYSTEM

from .conftest import ROOT, kill, make_task, manage, model_env, start_runloop, wait_for
from .support.llm_server import ModelServer, call, calls, commit, tool_results
from .support.sinks import Receiver

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver(dedupe=True) as sink:
        yield sink


def model_step(key: str, instructions: str, **fields: Any) -> dict[str, Any]:
    return {"key": key, "judge": "model", "instructions": instructions, **fields}


def now_step(body: dict[str, Any]) -> str:
    for message in reversed(body["messages"]):
        if message["role"] == "user":
            for line in message["content"].splitlines():
                if line.startswith("Your step now: "):
                    return line.removeprefix("Your step now: ").split(":")[0]
    raise AssertionError("no briefing")


def test_a_read_only_steps_revision_waits_for_dad_then_pays_once(
    tmp_path: Path, receiver: Receiver, processes: list[subprocess.Popen[bytes]], settings: Any
) -> None:
    pay = {"url": receiver.url(), "json": {"amount": 5000}}

    def script(body: dict[str, Any], n: int) -> Any:
        if not tool_results(body["messages"]):
            added = {"key": "pay", "tool": "http.post", "args": pay, "confirm_before": False}
            return call("add_steps", steps=[added])
        return commit(output="planned")

    with ModelServer(script) as model:
        settings.LOOP_LLM_BASE_URL = model.base_url
        env = model_env(model, LOOP_CONFIRM_SIDE_EFFECTS="true")
        task = make_task(model_step("look", "Look around."), title="look")
        worker = start_runloop(env=env, log=tmp_path / "worker.log")
        processes.append(worker)
        wait_for(lambda: goals.waits_for_approval(Task.objects.get(pk=task.pk)), timeout=60)
        assert receiver.posts == []
        out = manage("approve", str(task.pk), env=env)
        assert "approved:" in out
        wait_for(lambda: Task.objects.get(pk=task.pk).state == TaskState.DONE, timeout=60)
        kill(worker)
    assert [p.json for p in receiver.posts] == [{"amount": 5000}]
    added = Step.objects.get(task=task, key="pay")
    assert added.writer == "pippa" and not added.proposed


def test_the_standing_authorization_covers_the_template_and_nothing_pippa_adds(
    tmp_path: Path, processes: list[subprocess.Popen[bytes]], settings: Any
) -> None:
    """The template's own side-effect model step, which §10 covers, is auto-confirmed; the
    payment its read-only model step adds (`confirm_before: true`) is not: it waits for Dad."""
    with Receiver() as valve, Receiver() as bank:

        def script(body: dict[str, Any], n: int) -> Any:
            done = tool_results(body["messages"])
            if now_step(body) == "water":
                return (
                    commit(output="watered")
                    if done
                    else call("http_post", url=valve.url(), json={"open": 10})
                )
            if done:
                return commit(output="planned")
            added = {
                "key": "pay",
                "tool": "http.post",
                "args": {"url": bank.url(), "json": {"amount": 99}},
                "confirm_before": True,
            }
            return call("add_steps", steps=[added])

        with ModelServer(script) as model:
            settings.LOOP_LLM_BASE_URL = model.base_url
            spec = plans.validate(
                {
                    "title": "garden",
                    # Due once now (below), then not for a year: a run at the next minute
                    # boundary would open the valve again.
                    "schedule": "0 6 1 1 *",
                    "steps": [
                        model_step(
                            "water",
                            "Open the valve for 10 minutes.",
                            tools=["http.post"],
                            side_effect=True,
                            confirm_before=True,
                        ),
                        model_step("look", "Look at the weather."),
                    ],
                }
            )
            schedule = schedules.create(spec=spec, actor="dad", user=SYSTEM)
            Schedule.objects.filter(pk=schedule.pk).update(
                next_due=timezone.now() - timedelta(seconds=1)
            )
            worker = start_runloop(env=model_env(model), log=tmp_path / "worker.log")
            processes.append(worker)
            task = wait_for(lambda: Task.objects.filter(origin_run__schedule=schedule).first())
            wait_for(lambda: goals.waits_for_approval(Task.objects.get(pk=task.pk)), timeout=60)
            kill(worker)
        assert [p.json for p in valve.posts] == [{"open": 10}]
        assert bank.posts == []
    water, look, pay = task.steps.order_by("position")
    # look goes on in its next attempt, once Dad answered: its task waits for him.
    assert (water.state, look.state, pay.state) == ("done", "running", "pending")
    passes = Event.objects.filter(task=task, kind=EventKind.SIDE_EFFECT_AUTO_CONFIRMED)
    assert [e.step_id for e in passes] == [water.pk]
    assert (pay.writer, pay.proposed) == ("pippa", True)


def fresh_database(folder: Path, model: ModelServer) -> dict[str, str]:
    """A second installation: its own SQLite file and data folder, migrated from nothing."""
    folder.mkdir()
    env = model_env(model, DATABASE_URL=f"sqlite:///{folder / 'pippa.sqlite3'}")
    env["PIPPA_DATA_DIR"] = str(folder)
    subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "migrate", "-v0"],
        env=env,
        check=True,
        capture_output=True,
        timeout=120,
    )
    return env


def test_two_databases_never_share_an_idempotency_key(
    tmp_path: Path, receiver: Receiver, processes: list[subprocess.Popen[bytes]]
) -> None:
    """Two fresh installations (a reset, or two installs sharing a receiver) each make the
    same payment in their task 1, step 1, first reply: each goes out under a key of its own,
    so the receiver, which acts on a key once, acts on both."""
    post = ("http_post", {"url": receiver.url(), "json": {"amount": 4}})
    plan = {
        "title": "pay",
        "steps": [model_step("pay", "Pay 4.", tools=["http.post"], side_effect=True)],
    }
    (tmp_path / "plan.json").write_text(json.dumps(plan))

    def script(body: dict[str, Any], n: int) -> Any:
        return commit(output="paid") if tool_results(body["messages"]) else calls(post)

    with ModelServer(script) as model:
        envs = [fresh_database(tmp_path / name, model) for name in ("first", "second")]
        for n, env in enumerate(envs):
            assert manage("plan", str(tmp_path / "plan.json"), env=env).strip() == "1"
            worker = start_runloop(env=env, log=tmp_path / f"worker{n}.log")
            processes.append(worker)
            wait_for(lambda n=n: len(receiver.posts) == n + 1, timeout=60)
            kill(worker)
    keys = [p.key for p in receiver.posts]
    assert len(set(keys)) == 2, keys
    assert [p.json for p in receiver.acted] == [{"amount": 4}, {"amount": 4}]
    assert not Effect.objects.exists()  # the test's own database was never touched
