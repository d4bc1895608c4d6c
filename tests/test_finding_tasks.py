"""Finding tasks (issue 28, item 1): one filter reading shared by the Tasks page, GET /api/tasks
and the `tasks` command; a bad filter is refused naming its field on all three."""

from __future__ import annotations

import io
import json

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client

from loop.api.core import issue
from loop.models import Task
from loop.worker import Worker

from .conftest import make_task, run_until_idle, step


def logged_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def three(worker: Worker) -> list[Task]:
    """A done task whose output says "plumber", a running one, and one made from the dashboard."""
    paid = make_task(step("pay", args={"value": "the plumber, 80 EUR"}), title="Bills")
    run_until_idle(worker)
    walk = make_task(step("walk"), title="Walk")
    home = make_task(step("tidy"), title="Tidy the kitchen")
    Task.objects.filter(pk=home.pk).update(origin="dashboard")
    return [paid, walk, home]


def test_the_page_the_api_and_the_command_find_the_same_tasks(dad: User, three: list[Task]) -> None:
    paid, walk, home = three
    page = logged_in(dad)
    listed = page.get("/tasks/").content.decode()
    # Newest first, every task, with counts per state.
    assert listed.index(f'id="found-{home.pk}"') < listed.index(f'id="found-{walk.pk}"')
    assert listed.index(f'id="found-{walk.pk}"') < listed.index(f'id="found-{paid.pk}"')
    assert 'data-state="done"' in listed and "3 tasks" in listed
    # Words in a step's output find its task.
    found = page.get("/tasks/?q=PLUMBER").content.decode()
    assert f'id="found-{paid.pk}"' in found and f'id="found-{walk.pk}"' not in found
    assert f'id="found-{home.pk}"' in page.get("/tasks/?origin=dashboard").content.decode()
    running = page.get("/tasks/?state=running").content.decode()
    assert f'id="found-{paid.pk}"' not in running and f'id="found-{walk.pk}"' in running

    _, token = issue(name="pippa", user=dad)
    api = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
    answer = api.get("/api/tasks?q=plumber")
    assert [t["id"] for t in answer.json()] == [paid.pk]
    assert answer["X-Total-Count"] == "1"
    assert [t["id"] for t in api.get("/api/tasks").json()] == [home.pk, walk.pk, paid.pk]
    assert api.get("/api/tasks/counts?origin=dashboard").json()["running"] == 1
    assert api.get("/api/tasks/counts").json() | {} == {
        "planning": 0, "running": 2, "paused": 0, "blocked": 0,
        "done": 1, "failed": 0, "superseded": 0,
    }  # fmt: skip

    out = io.StringIO()
    call_command("tasks", "--json", "--state", "running", stdout=out)
    assert [t["id"] for t in json.loads(out.getvalue())] == [home.pk, walk.pk]
    out = io.StringIO()
    call_command("tasks", "--q", "plumber", stdout=out)
    assert "Bills" in out.getvalue() and "Walk" not in out.getvalue()


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("state=sleeping", "state"),
        ("origin=mars", "origin"),
        ("since=2026-13-01", "since"),
        ("since=2026-02-02&until=2026-01-01", "until"),
        ("page=0", "page"),
        ("page=9", "page"),
        ("schedule=x", "schedule"),
        ("colour=red", "colour"),
    ],
)
def test_a_bad_filter_is_refused_naming_its_field(dad: User, query: str, field: str) -> None:
    make_task(step("a"))
    _, token = issue(name="pippa", user=dad)
    answer = Client(HTTP_AUTHORIZATION=f"Bearer {token}").get(f"/api/tasks?{query}")
    assert answer.status_code == 400 and answer.json()["error"].startswith(f"{field}: ")
    page = logged_in(dad).get(f"/tasks/?{query}")
    assert page.status_code == 400 and f"{field}: " in page.content.decode()
    name, value = query.split("&")[0].split("=")
    if name in ("state", "origin", "since", "page") and "&" not in query:
        with pytest.raises(CommandError, match=f"^{name}: "):
            call_command("tasks", f"--{name}", value, stdout=io.StringIO())
