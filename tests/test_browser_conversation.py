"""Dad in Chromium (DESIGN.md §10): the conversation page lists the schedules with their next
due time; a message he writes there ends the scheduled run's standing authorization, so its
task's "May I do this?" then asks him instead of running. Screenshots in test-artifacts/."""

from __future__ import annotations

import subprocess
from datetime import timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from loop import plans, schedules
from loop.models import Schedule, Step, Task
from loop.permissions import SYSTEM

from .conftest import manage, process_env, start_runloop, wait_for
from .test_browser import (  # noqa: F401  (fixtures)
    Receiver,
    browser,
    dad_user,
    launched_chromium,
    live_open,
    log_in,
    pay_step,
    receiver,
    shot,
    site,
    still_same_page,
)

# what a person sees: tried on the SQLite run
pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.sqlite_only,
]


def test_dad_writes_and_the_scheduled_payment_asks_him_instead_of_running(
    request: pytest.FixtureRequest,
    transactional_db: None,
    processes: list[subprocess.Popen[bytes]],
    tmp_path: Path,
) -> None:
    from playwright.sync_api import expect

    # test_browser's fixtures, by name: a real daphne, Chromium, Dad, a webhook receiver.
    base: str = request.getfixturevalue("site")
    chromium: Any = request.getfixturevalue("browser")
    request.getfixturevalue("dad_user")
    sink: Receiver = request.getfixturevalue("receiver")

    plan = {
        "title": "Pay the plumber weekly",
        "schedule": "0 8 * * MON",
        "timezone": "Europe/Berlin",
        "steps": [pay_step(sink.url, confirm_before=True)],
    }
    schedule = schedules.create(spec=plans.validate(plan), actor="dad", user=SYSTEM)
    Schedule.objects.filter(pk=schedule.pk).update(next_due=timezone.now() - timedelta(minutes=1))
    [run] = schedules.fire_due(actor="test")  # this week's run: its task waits for a worker
    schedule.refresh_from_db()
    task = Task.objects.get(origin_run=run)

    page = log_in(chromium, base, "dad", "dad-password-1")
    page.goto(base + "/conversation")
    live_open(page)
    expect(page.locator(f"#message-{run.message_id}")).to_contain_text(
        "[SCHEDULED TASK] Pay the plumber weekly"
    )
    row = page.locator(f"#schedule-{schedule.pk}")
    local = schedule.next_due.astimezone(ZoneInfo("Europe/Berlin"))
    assert local.weekday() == 0 and local.hour == 8 and schedule.next_due > timezone.now()
    expect(row.locator(".next-due time")).to_have_attribute(
        "datetime", schedule.next_due.isoformat()
    )
    expect(row.locator(".next-due")).to_contain_text(local.strftime("Mon %b %-d, 08:00"))
    expect(row.locator(".last-run")).to_contain_text(f"task {task.pk}")
    shot(page, "conversation-schedules.png")

    page.fill("#message-text", "Wait - the plumber has not finished yet.")
    page.click("form.write button[type=submit]")
    page.wait_for_url(base + "/conversation")
    mine = page.locator(".message.author-user").last
    expect(mine).to_contain_text("Wait - the plumber has not finished yet.")
    live_open(page)
    page.evaluate("window.__noReload = true")

    # Mum answers from the shell: the message arrives live, without a reload.
    User.objects.create_user("mum")
    manage("say", "I will tell the plumber.", "--as", "mum")
    expect(page.locator(".message").last).to_contain_text("I will tell the plumber.")
    assert still_same_page(page)

    worker = start_runloop(env=process_env(LOOP_IDLE_SLEEP_MS="50"), log=tmp_path / "runloop.log")
    processes.append(worker)
    wait_for(lambda: Step.objects.get(task=task).state == "blocked", timeout=60)
    pay = Step.objects.get(task=task)
    assert pay.question_kind == "may_i" and sink.total == 0

    page.goto(base + "/")
    question = page.locator(f"#question-{pay.pk}")
    expect(question).to_contain_text("May I do this?")
    expect(question).to_contain_text("Pay the plumber weekly")
    shot(page, "conversation-scheduled-task-asks.png")
    page.goto(base + f"/tasks/{task.pk}")
    expect(page.locator("#task-head")).to_contain_text("from schedule Pay the plumber weekly")
    assert sink.total == 0
