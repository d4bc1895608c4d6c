"""Boot reconciliation (DESIGN.md §9): a starting worker settles only the dead workers' effects
and releases their leases; a live worker's work is never touched."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.utils import timezone

from loop.models import Effect, Event, Step, Task, Worker

from .conftest import kill, make_task, process_env, start_runloop, step, wait_for
from .support.sinks import Receiver

DIED = "server process ended before the effect completed"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as sink:
        yield sink


def hook(key: str, url: str) -> dict[str, Any]:
    return step(key, "http.post", args={"url": url, "json": {"from": key}})


def worker_named(label: str) -> Worker:
    return wait_for(lambda: Worker.objects.filter(label=label).first())


@pytest.mark.slow
def test_a_new_worker_settles_only_the_dead_workers_effects(
    transactional_db: None,
    receiver: Receiver,
    processes: list[subprocess.Popen[bytes]],
) -> None:
    env = process_env(LOOP_HTTP_TIMEOUT="300", LOOP_HEARTBEAT_SECONDS="1", LOOP_IDLE_SLEEP_MS="50")
    receiver.behave("hang", "hang")  # both POSTs are held: each worker is mid-effect

    doomed_task = make_task(hook("doomed", receiver.url("/doomed")))
    doomed_proc = start_runloop("--worker-id", "doomed", env=env)
    processes.append(doomed_proc)
    wait_for(lambda: len(receiver.posts) == 1)
    live_task = make_task(hook("live", receiver.url("/live")))
    processes.append(start_runloop("--worker-id", "live", env=env))
    wait_for(lambda: len(receiver.posts) == 2)
    doomed, live = worker_named("doomed"), worker_named("live")
    live_effect = Effect.objects.get(task=live_task)
    assert live_effect.state == "running" and live_effect.lease_owner == live.pk

    kill(doomed_proc)  # SIGKILL mid-effect
    processes.append(start_runloop("--worker-id", "fresh", env=env))
    fresh = worker_named("fresh")

    doomed_effect = wait_for(
        lambda: Effect.objects.filter(task=doomed_task, state="uncertain").first()
    )
    assert doomed_effect.error == DIED
    assert Worker.objects.get(pk=doomed.pk).state == "dead"
    settled = Event.objects.get(kind="effect_state", effect=doomed_effect, data__new="uncertain")
    # The live worker settles it at once (it looks for dead peers every second), or the fresh
    # one's boot does, whichever comes first; never anyone else.
    assert settled.actor.startswith("boot:") or settled.actor == f"worker:{live.pk}"
    assert Event.objects.filter(kind="lease_released", task=doomed_task).exists()
    doomed_step = wait_for(lambda: Step.objects.filter(task=doomed_task, state="blocked").first())
    assert doomed_step.question_kind == "did_it_happen"
    assert f"http.post → POST {receiver.url('/doomed')}" in doomed_step.question_text

    live_effect.refresh_from_db()
    live_task.refresh_from_db()
    assert live_effect.state == "running" and live_effect.lease_owner == live.pk
    assert live_task.lease_owner == live.pk
    assert Worker.objects.get(pk=live.pk).state == "running"
    assert not Event.objects.filter(kind="worker_dead", data__worker=live.pk).exists()
    assert fresh.pk not in (live_task.lease_owner, doomed.pk)

    receiver.release()  # the live worker's POST answers; it finishes its own step
    wait_for(lambda: Step.objects.filter(task=live_task, state="done").exists())
    assert [r.path for r in receiver.posts] == ["/doomed", "/live"]


def running_effect(task: Task, worker: Worker, *, until_minutes: int = 1) -> Effect:
    """`task`'s step started by `worker`, whose effect it claimed and has not settled."""
    step_row = Step.objects.get(task=task)
    Step.objects.filter(pk=step_row.pk).update(state="running", attempts=1)
    until = timezone.now() + timedelta(minutes=until_minutes)
    Task.objects.filter(pk=task.pk).update(lease_owner=worker.pk, lease_until=until, lease_epoch=1)
    return Effect.objects.create(
        id=f"{task.pk:064d}",
        task=task,
        step=step_row,
        tool=step_row.tool,
        safe_to_repeat=step_row.tool == "file.write",
        request=step_row.args,
        state="running",
        lease_owner=worker.pk,
        lease_epoch=1,
        lease_until=until,
        sends=1,
    )


def test_reconcile_on_demand_settles_a_dead_workers_effects_by_kind(db: None) -> None:
    long_ago = timezone.now() - timedelta(hours=1)
    dead = Worker.objects.create(label="gone", host="elsewhere", pid=1, last_seen=long_ago)
    alive = Worker.objects.create(label="busy", host="elsewhere", pid=2)
    post = running_effect(make_task(hook("post", "http://127.0.0.1:9/")), dead)
    write = running_effect(
        make_task(step("write", "file.write", args={"path": "a.txt", "content": "a"})), dead
    )
    busy = running_effect(make_task(hook("busy", "http://127.0.0.1:9/")), alive)

    call_command("reconcile")

    post.refresh_from_db()
    write.refresh_from_db()
    busy.refresh_from_db()
    assert post.state == "uncertain" and post.error == DIED
    assert write.state == "pending" and write.error == DIED  # safe to repeat: done again
    assert Task.objects.filter(lease_owner=dead.pk).count() == 0
    assert busy.state == "running" and busy.lease_owner == alive.pk
    assert Task.objects.get(pk=busy.task_id).lease_owner == alive.pk
    assert Worker.objects.get(pk=dead.pk).state == "dead"
    assert Worker.objects.get(pk=alive.pk).state == "running"

    call_command("reconcile")  # again: nothing left to do, nothing changes
    assert Event.objects.filter(kind="worker_dead").count() == 1
