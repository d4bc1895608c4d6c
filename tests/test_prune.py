"""Retention (`manage.py prune`, LOOP_PRUNE_AFTER_DAYS): finished tasks' history older than
the window goes in small committed batches; an open task's never does, nor a command receipt
inside its replay window; a live page whose last seen event was pruned reloads."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from loop import actions, prune
from loop.models import AgentToken, Effect, Event, Receipt, Step, Task
from loop.permissions import SYSTEM
from loop.web import live
from loop.worker import Worker

from . import test_browser as web
from .conftest import make_task, run_until_idle, step, wait_for
from .test_live_consumer import connect_as, own_channel_layer, run  # noqa: F401

site, browser, dad_user = web.site, web.browser, web.dad_user  # the browser tests' fixtures
launched_chromium = web.launched_chromium
OLD = timezone.now() - timedelta(days=100)


def finished_task(runner: Worker, title: str) -> Task:
    """A task run to `done` by the worker, with a side effect (an effect row) and events."""
    task = make_task(
        step("read", "echo"),
        step("write", "file.write", args={"path": f"{title}.txt", "content": title}),
        title=title,
    )
    run_until_idle(runner)
    task.refresh_from_db()
    assert task.state == "done", task.state
    return task


def age(task: Task) -> None:
    """Make the task, its history and its events look 100 days old (the test's clock)."""
    Task.objects.filter(pk=task.pk).update(updated_at=OLD, created_at=OLD)
    Event.objects.filter(task=task).update(created_at=OLD)


def history(task: Task) -> dict[str, int]:
    return {
        "events": Event.objects.filter(task_id=task.pk).count(),
        "effects": Effect.objects.filter(task_id=task.pk).count(),
        "steps": Step.objects.filter(task_id=task.pk).count(),
        "tasks": Task.objects.filter(pk=task.pk).count(),
    }


def receipt(agent: AgentToken, key: str, scope: str, days: float) -> Receipt:
    made = Receipt.objects.create(
        agent=agent, command_id=key, scope=scope, digest="0" * 64, status=200, body={}
    )
    Receipt.objects.filter(pk=made.pk).update(created_at=timezone.now() - timedelta(days=days))
    return made


@pytest.fixture
def agent(dad: User) -> AgentToken:
    return AgentToken.objects.create(name="bot", user=dad, digest="1" * 64, prefix="abc")


def test_prune_takes_old_finished_history_and_leaves_open_tasks_alone(
    worker: Worker, file_root: Path, capsys: Any
) -> None:
    gone = finished_task(worker, "gone")
    recent = finished_task(worker, "recent")  # finished, but inside the window
    age(gone)
    paused = make_task(step("a"), step("b"), title="paused")
    actions.pause(task_id=paused.pk, actor="dad", user=SYSTEM)
    age(paused)  # old, but open: never touched
    before_paused, before_recent = history(paused), history(recent)
    assert all(history(gone).values()) and before_paused["events"]

    call_command("prune", "--older-than", "30")

    assert history(gone) == {"events": 0, "effects": 0, "steps": 0, "tasks": 0}
    assert history(paused) == before_paused
    assert history(recent) == before_recent
    assert "tasks: deleted 1" in capsys.readouterr().out


def test_dry_run_counts_and_deletes_nothing(worker: Worker, file_root: Path, capsys: Any) -> None:
    gone = finished_task(worker, "gone")
    age(gone)
    before = history(gone)

    call_command("prune", "--older-than", "30", "--dry-run")

    out = capsys.readouterr().out
    for table in ("events", "effects", "steps", "tasks"):
        assert f"{table}: would delete {before[table]}" in out
    assert history(gone) == before


def test_receipts_inside_their_replay_window_or_of_an_open_task_stay(
    agent: AgentToken, settings: Any
) -> None:
    settings.LOOP_RECEIPT_REPLAY_DAYS = 30
    open_task = make_task(step("a"), title="open")
    done_task = make_task(step("a"), title="finished, gone already")
    Task.objects.filter(pk=done_task.pk).update(state="done")
    of_open = receipt(agent, "k3", f"POST /api/tasks/{open_task.pk}/pause", days=40)
    expired = receipt(agent, "k1", "POST /api/tasks", days=40)
    replayable = receipt(agent, "k2", "POST /api/tasks", days=20)  # older than --older-than 10
    of_done = receipt(agent, "k4", f"POST /api/tasks/{done_task.pk}/pause", days=40)

    # Batches of one: the receipt of the open task, first in line, is read past, not stuck on.
    deleted = prune.prune(prune.Window.of(10), limit=1)

    left = set(Receipt.objects.values_list("pk", flat=True))
    assert left == {replayable.pk, of_open.pk}
    assert expired.pk not in left and of_done.pk not in left
    assert deleted["receipts"] == 2


@pytest.mark.parametrize("days", ["-1", "nan", "inf", "1e308", "36501"])
def test_a_window_that_is_no_number_of_days_is_refused_by_name(db: None, days: str) -> None:
    from django.core.management.base import CommandError

    make_task(step("a"))
    with pytest.raises(CommandError, match="older-than: must be a number of days from 0 to"):
        call_command("prune", "--older-than", days)
    assert Task.objects.count() == 1


def test_each_batch_is_small_and_committed_before_the_next(
    transactional_db: None, file_root: Path
) -> None:
    runner = Worker(label="test")
    runner.boot()
    tasks = [finished_task(runner, f"t{n}") for n in range(3)]
    for task in tasks:
        age(task)
    total_events = Event.objects.filter(task__in=tasks).count()
    sizes: list[tuple[str, int]] = []

    def each(table: str, went: int) -> None:
        assert not connection.in_atomic_block  # the batch's transaction has committed
        sizes.append((table, went))

    deleted = prune.prune(prune.Window.of(30), limit=4, each=each)

    assert all(went <= 4 for _, went in sizes)
    assert deleted["events"] == total_events > 4
    assert len([s for s in sizes if s[0] == "events"]) == -(-total_events // 4)
    assert not Task.objects.filter(pk__in=[t.pk for t in tasks]).exists()


def test_a_worker_prunes_one_small_batch_at_a_time(
    worker: Worker, file_root: Path, settings: Any
) -> None:
    gone = finished_task(worker, "gone")
    age(gone)
    settings.LOOP_PRUNE_AFTER_DAYS = 30
    events = history(gone)["events"]

    assert worker.prune_some() == min(events, prune.BATCH)
    while worker.prune_some():
        pass
    assert history(gone) == {"events": 0, "effects": 0, "steps": 0, "tasks": 0}


def test_a_page_whose_last_event_was_pruned_reloads(
    transactional_db: None, dad: User, file_root: Path
) -> None:
    runner = Worker(label="test")
    runner.boot()
    gone = finished_task(runner, "gone")
    kept = make_task(step("a"), title="open")
    actions.pause(task_id=kept.pk, actor="dad", user=SYSTEM)
    last_of_gone = Event.objects.filter(task=gone).latest("id").pk
    survivor = Event.objects.filter(task=kept).earliest("id").pk
    age(gone)
    prune.prune(prune.Window.of(30))
    assert not Event.objects.filter(pk=last_of_gone).exists()
    db = database_sync_to_async

    async def scenario() -> None:
        await get_channel_layer().flush()
        stale = await connect_as(dad, f"topic=home&after={last_of_gone}")
        assert await stale.receive_json_from(timeout=5) == {"reload": True}
        await stale.disconnect()

        page = await connect_as(dad, f"topic=task-{kept.pk}&after={survivor}")
        replayed = await page.receive_json_from(timeout=5)
        assert "reload" not in replayed
        expected = await db(lambda: list(Event.objects.filter(task=kept, id__gt=survivor)))()
        # (PostgreSQL re-reads a trailing window of ids, so `survivor` itself may come too.)
        assert set(replayed["events"]) - {survivor} == {e.pk for e in expected}

        # The feed goes on after the prune: a new event reaches the open page.
        await db(actions.resume)(task_id=kept.pk, actor="dad", user=SYSTEM)
        pushed = await page.receive_json_from(timeout=5)
        assert pushed["events"]
        await page.disconnect()
        await live.tailer().stop()

    run(scenario)


def test_a_reconnecting_browser_page_whose_last_event_was_pruned_loads_afresh(
    site: str, browser: Any, dad_user: User
) -> None:
    from playwright.sync_api import expect

    runner = Worker(label="test")
    runner.boot()
    gone = make_task(step("a"), title="finished long ago")
    run_until_idle(runner)
    page = web.log_in(browser, site, "dad", "dad-password-1")
    # The socket's replay (read after its handshake) has arrived: what follows is a reconnect.
    wait_for(lambda: page.evaluate("window.pippaLive.messages") >= 1, timeout=15)
    last = int(page.evaluate("window.pippaLive.last"))
    assert last == Event.objects.filter(task=gone).latest("id").pk  # the page's newest event
    age(gone)
    assert prune.prune(prune.Window.of(30))["tasks"] == 1
    assert not Event.objects.filter(pk=last).exists()
    with page.expect_navigation(timeout=30000):  # it reloads: no error, no gap
        page.evaluate("window.pippaLive.socket.close()")  # a blip: it reconnects from `last`
    web.live_open(page)
    assert not web.still_same_page(page)
    expect(page.get_by_text("finished long ago")).to_have_count(0)
    page.evaluate("window.__noReload = true")

    # The feed goes on: a task made now appears on the reloaded page, live.
    kept = make_task(step("b"), title="open and new")
    actions.pause(task_id=kept.pk, actor="dad", user=SYSTEM)
    page.get_by_text("open and new").first.wait_for()
    assert web.still_same_page(page)  # pushed to the page, not another reload
