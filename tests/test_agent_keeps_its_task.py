"""An agent that drives a task over the API keeps it between its commits (DESIGN.md §8, §12):
workers do not take it meanwhile, until the agent lets go (`release` on a commit, or
`POST /api/tasks/{id}/release`) or its lease runs out. The dashboard says who holds a task."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from loop import actions
from loop.api.core import issue
from loop.models import AgentToken, Event, EventKind, Step, Task
from loop.models import Worker as WorkerRow
from loop.permissions import SYSTEM
from loop.worker import Worker

from .conftest import claim_and_start, make_task, process_env, start_runloop, step, wait_for
from .support.loopapp.tools import read_runs
from .test_api import Agent

AGENT_STEPS = ("a", "b", "c", "d", "e")


def recorded(log: Path, *keys: str) -> list[dict[str, Any]]:
    return [step(key, "test.record", args={"log": str(log)}) for key in keys]


def two_workers(tmp_path: Path, processes: list[subprocess.Popen[bytes]]) -> None:
    env = process_env(LOOP_IDLE_SLEEP_MS="20", LOOP_HEARTBEAT_SECONDS="1")
    workers = [start_runloop(env=env, log=tmp_path / f"runloop{n}.out") for n in (1, 2)]
    processes.extend(workers)
    for proc in workers:
        wait_for(lambda p=proc: WorkerRow.objects.filter(pid=p.pid, state="running").exists())


def drive(agent: Agent, task: Task, key: str, *, release: bool = False) -> dict[str, Any]:
    """`next`, a moment of the agent's own work (workers poll every 20 ms meanwhile), `commit`."""
    taken = agent.post(f"/api/tasks/{task.pk}/next")
    assert taken.status_code == 200, taken.json()
    body = taken.json()
    assert body["step"]["key"] == key
    time.sleep(0.3)
    done = agent.post(
        f"/api/steps/{body['step']['id']}/commit",
        {
            "lease_token": body["lease_token"],
            "verdict": "done",
            "output": {"by": "pippa", "key": key},
            "release": release,
        },
    )
    assert done.status_code == 200, done.json()
    return done.json()


def starters(task: Task) -> dict[str, list[str]]:
    """Who started each step, by key, from the journal."""
    found: dict[str, list[str]] = {}
    for event in Event.objects.filter(
        task=task, kind__in=[EventKind.STEP_STARTED, EventKind.STEP_RESTARTED]
    ).select_related("step"):
        assert event.step is not None
        found.setdefault(event.step.key, []).append(event.actor)
    return found


@pytest.mark.slow
def test_workers_leave_an_agents_task_alone_between_its_commits_until_it_lets_go(
    transactional_db: None, dad: User, tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    pippa = Agent(issue(name="pippa", user=dad)[1])
    owner = -AgentToken.objects.get(name="pippa").pk
    log = tmp_path / "runs.log"
    task = make_task(*recorded(log, *AGENT_STEPS, "f"), title="five steps by hand", driver="pippa")
    first = pippa.post(f"/api/tasks/{task.pk}/next").json()  # before any worker could take it
    assert first["step"]["key"] == "a"
    two_workers(tmp_path, processes)
    time.sleep(0.3)
    pippa.post(
        f"/api/steps/{first['step']['id']}/commit",
        {"lease_token": first["lease_token"], "verdict": "done", "output": {"by": "pippa"}},
    )
    for key in AGENT_STEPS[1:-1]:
        answer = drive(pippa, task, key)
        assert answer["lease_until"] is not None
        time.sleep(0.3)  # between commit and next: a worker would claim a free task now
        assert Task.objects.get(pk=task.pk).lease_owner == owner
    let_go = drive(pippa, task, AGENT_STEPS[-1], release=True)
    assert let_go["lease_until"] is None

    wait_for(lambda: Task.objects.get(pk=task.pk).state == "done", timeout=60)
    who = starters(task)
    assert {key: who[key] for key in AGENT_STEPS} == {key: ["agent:pippa"] for key in AGENT_STEPS}
    assert who["f"][0].startswith("worker:") and len(who["f"]) == 1
    assert [run.step for run in read_runs(log)] == ["f"]  # no worker ran an agent's step
    outputs = dict(Step.objects.filter(task=task).values_list("key", "output"))
    assert all(outputs[key]["by"] == "pippa" for key in AGENT_STEPS)


@pytest.mark.slow
def test_a_worker_takes_the_task_once_the_agents_lease_runs_out(
    transactional_db: None,
    dad: User,
    tmp_path: Path,
    processes: list[subprocess.Popen[bytes]],
    settings: Any,
) -> None:
    settings.LOOP_AGENT_LEASE_SECONDS = 4
    pippa = Agent(issue(name="pippa", user=dad)[1])
    log = tmp_path / "runs.log"
    task = make_task(*recorded(log, "a", "b"), title="left behind", driver="pippa")
    first = pippa.post(f"/api/tasks/{task.pk}/next").json()
    two_workers(tmp_path, processes)
    renewed = pippa.post(
        f"/api/steps/{first['step']['id']}/renew", {"lease_token": first["lease_token"]}
    )
    assert renewed.status_code == 200  # 4 seconds from now, the workers running
    pippa.post(
        f"/api/steps/{first['step']['id']}/commit",
        {"lease_token": first["lease_token"], "verdict": "done"},
    )
    assert Task.objects.get(pk=task.pk).lease_owner is not None  # still the agent's
    time.sleep(1)
    assert Step.objects.get(task=task, key="b").state == "pending"
    wait_for(lambda: Task.objects.get(pk=task.pk).state == "done", timeout=30)
    who = starters(task)
    assert who["a"] == ["agent:pippa"] and who["b"][0].startswith("worker:")
    late = pippa.post(f"/api/tasks/{task.pk}/next")
    assert late.status_code == 409


def test_release_lets_go_only_of_the_agents_own_task(dad: User, worker: Worker) -> None:
    pippa = Agent(issue(name="pippa", user=dad)[1])
    visitor = Agent(issue(name="visitor", user=dad)[1])  # may drive, but holds nothing
    task = make_task(step("a"), step("b"), driver="pippa")
    taken = pippa.post(f"/api/tasks/{task.pk}/next").json()
    bad = pippa.post(
        f"/api/steps/{taken['step']['id']}/commit",
        {"lease_token": taken["lease_token"], "verdict": "done", "release": "yes"},
    )
    assert bad.status_code == 400
    assert bad.json()["error"] == "release: must be true or false"
    pippa.post(
        f"/api/steps/{taken['step']['id']}/commit",
        {"lease_token": taken["lease_token"], "verdict": "done"},
    )
    assert worker.tick() is False  # kept between commits
    not_theirs = visitor.post(f"/api/tasks/{task.pk}/release")
    assert not_theirs.status_code == 403  # not the visitor's task at all
    assert f"task {task.pk} is not agent 'visitor''s" in not_theirs.json()["error"]
    assert visitor.post(f"/api/tasks/{task.pk}/next").status_code == 403
    actions.give(task_id=task.pk, agent="visitor", actor="dad", user=SYSTEM)
    not_held = visitor.post(f"/api/tasks/{task.pk}/release")
    assert not_held.status_code == 409  # its task now, but pippa still holds the lease
    assert not_held.json()["error"].startswith(
        f"lease: task {task.pk} is held by agent:pippa, not by agent:visitor"
    )
    actions.give(task_id=task.pk, agent="pippa", actor="dad", user=SYSTEM)
    unknown_field = pippa.post(f"/api/tasks/{task.pk}/release", {"now": True})
    assert unknown_field.status_code == 400
    released = pippa.post(f"/api/tasks/{task.pk}/release")
    assert released.status_code == 200
    assert released.json()["task"]["id"] == task.pk
    [event] = Event.objects.filter(task=task, kind=EventKind.LEASE_RELEASED)
    assert event.actor == "agent:pippa"
    again = pippa.post(f"/api/tasks/{task.pk}/release")
    assert again.status_code == 409
    assert again.json()["error"] == f"lease: task {task.pk} is not held, not by agent:pippa"
    assert worker.tick() is True
    assert Step.objects.get(task=task, key="b").state == "done"


def test_the_dashboard_says_who_holds_a_task_and_until_when(
    dad: User, worker: Worker, settings: Any
) -> None:
    settings.LOOP_AGENT_LEASE_SECONDS = 600
    pippa = Agent(issue(name="pippa", user=dad)[1])
    by_hand = make_task(step("a"), step("b"), title="by hand", driver="pippa")
    by_worker = make_task(step("x"), step("y"), title="by worker")
    pippa.post(f"/api/tasks/{by_hand.pk}/next")
    claim_and_start(worker)  # the only free task: by_worker
    browser = Client()
    browser.force_login(dad)

    home = browser.get(reverse("loop:home")).content.decode()
    until = Task.objects.get(pk=by_hand.pk).lease_until
    assert until is not None
    hand_row = home[home.index(f'id="task-row-{by_hand.pk}"') :].split("</li>")[0]
    assert "held by agent <strong>pippa</strong>" in hand_row
    assert until.strftime("%H:%M:%S") in hand_row
    worker_row = home[home.index(f'id="task-row-{by_worker.pk}"') :].split("</li>")[0]
    assert "held by worker <strong>test</strong>" in worker_row

    page = browser.get(reverse("loop:task", args=[by_hand.pk])).content.decode()
    assert 'id="task-holder" data-kind="agent"' in page
    assert "held by agent <strong>pippa</strong> until" in page
    pippa.post(f"/api/tasks/{by_hand.pk}/release")
    page = browser.get(reverse("loop:task", args=[by_hand.pk])).content.decode()
    assert 'id="task-holder"' not in page


@pytest.mark.parametrize(
    ("form", "how"),
    [
        ({}, "Allowed once: "),
        ({"edit": "1"}, "Allowed once, as it was (your edit changed nothing): "),
    ],
)
def test_allow_once_on_an_agents_task_says_the_agent_takes_it_up(
    dad: User, worker: Worker, settings: Any, form: dict[str, str], how: str
) -> None:
    """The flash after "Allow once" (or "Edit, then allow") says who runs the step now: not a
    worker's next tick while an agent holds the task."""
    pippa = Agent(issue(name="pippa", user=dad)[1])
    task = make_task(step("pay", "test.seen_once", confirm_before=True), driver="pippa")
    asked = pippa.post(f"/api/tasks/{task.pk}/next")
    assert asked.status_code == 200 and asked.json()["step"] is None, asked.json()
    blocked = Step.objects.get(task=task, key="pay")
    assert blocked.state == "blocked"
    browser = Client()
    browser.force_login(dad)
    said = browser.post(
        reverse("loop:decide", args=[blocked.pk]), {"decision": "allow", **form}, follow=True
    ).content.decode()
    assert how in said and "runs when agent:pippa takes it up, or its lease ends at" in said
    assert "runs on the next tick" not in said
