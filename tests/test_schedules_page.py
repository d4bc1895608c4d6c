"""The Schedules page (issue 28, item 3): each schedule in words with its next three runs, on/off,
Run now, edit, its runs with their tasks; and the words themselves."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import User
from django.test import Client

from loop import cron
from loop.models import Schedule, Task

from .conftest import step


@pytest.mark.sqlite_only
@pytest.mark.parametrize(
    ("expr", "words"),
    [
        ("0 7 * * *", "every day at 07:00, Europe/Berlin"),
        ("@daily", "every day at 00:00, Europe/Berlin"),
        ("*/15 * * * *", "every 15 minutes, Europe/Berlin"),
        ("30 * * * *", "every hour at 30 past, Europe/Berlin"),
        ("0 8 * * MON", "every Monday at 08:00, Europe/Berlin"),
        ("5 9 * * 1-5", "every weekday at 09:05, Europe/Berlin"),
        ("0 6 1 * *", "on day 1 of every month at 06:00, Europe/Berlin"),
        ("0 6 1 1,7 *", "cron 0 6 1 1,7 *, Europe/Berlin"),
    ],
)
def test_a_schedule_in_words(expr: str, words: str) -> None:
    assert cron.in_words(expr, "Europe/Berlin") == words


def test_the_page_switches_runs_now_and_edits(db: None, dad: User) -> None:
    client = Client()
    client.force_login(dad)
    plan = {"title": "morning", "schedule": "0 7 * * *", "timezone": "Europe/Berlin"}
    made = client.post("/tasks/new", {"plan": json.dumps({**plan, "steps": [step("a")]})})
    schedule = Schedule.objects.get()
    page = client.get(made["Location"]).content.decode()
    assert "every day at 07:00, Europe/Berlin" in page and "made: it runs" in page
    assert page.count('class="when"') == 3  # the next three runs, nothing run yet
    assert client.post(f"/schedules/{schedule.pk}/run").status_code == 302
    task = Task.objects.get()
    assert task.origin_run is not None and task.origin_run.schedule == schedule
    page = client.get("/schedules/").content.decode()
    assert f'href="/tasks/{task.pk}"' in page and f'id="run-{task.origin_run_id}"' in page
    client.post(f"/schedules/{schedule.pk}/switch", {"enabled": "off"})
    schedule.refresh_from_db()
    assert not schedule.enabled
    assert "it does not run until you switch it on" in client.get("/schedules/").content.decode()
    bad = client.post(f"/schedules/{schedule.pk}/edit", {"cron": "61 * * * *"})
    assert bad.status_code == 400 and "cron" in bad.content.decode()
    client.post(f"/schedules/{schedule.pk}/edit", {"cron": "30 6 * * *", "name": "early"})
    schedule.refresh_from_db()
    assert (schedule.name, schedule.cron) == ("early", "30 6 * * *")
