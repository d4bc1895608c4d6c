"""Finding, fixing and following tasks in a real Chromium (issue 28, items 1-5), at 1280 and at
390 px wide, against a real daphne and a real `runloop`: the Tasks page, Retry on a failed
step, the Schedules page, one clock, and a task's counters checked against its steps after
every live push. Each page fits its width; the screenshots land in PIPPA_SHOTS if set."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from loop.models import Schedule, Step, Task

from .conftest import make_task, process_env, step, wait_for
from .test_browser import (  # noqa: F401 - the fixtures
    browser,
    dad_user,
    launched_chromium,
    live_open,
    runloop,
    site,
)

COUNTS = """() => {
  const head = document.querySelector('#task-counters');
  const steps = [...document.querySelectorAll('li.step')].map(li => li.dataset.state);
  return [Number(head.dataset.done), steps.filter(s => s === 'done').length,
          Number(head.dataset.total), steps.length];
}"""


@pytest.fixture
def files(tmp_path: Path) -> Path:
    root = tmp_path / "files"
    root.mkdir()
    return root


@pytest.fixture
def worker_env(files: Path) -> dict[str, str]:
    """The runloop's environment: its file root is `files`."""
    return process_env(
        LOOP_IDLE_SLEEP_MS="50", LOOP_HEARTBEAT_SECONDS="1", LOOP_FILE_ROOT=str(files)
    )


def shot(page: Any, name: str, width: int) -> None:
    """The page fits its width, no sideways scrolling; its picture, if asked for."""
    folder = os.environ.get("PIPPA_SHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=f"{folder}/{name}-{width}.png", full_page=True)
    wide = page.evaluate("document.documentElement.scrollWidth")
    assert wide <= width, f"{name} is {wide} px wide at {width}"


@pytest.mark.parametrize("width", [1280, 390])
def test_dad_finds_fixes_and_follows_tasks(
    width: int,
    browser: Any,  # noqa: F811
    site: str,  # noqa: F811
    runloop: subprocess.Popen[bytes],  # noqa: F811
    dad_user: User,  # noqa: F811
    files: Path,
) -> None:
    from playwright.sync_api import expect

    page = browser.new_page(viewport={"width": width, "height": 844 if width < 500 else 900})
    page.set_default_timeout(20000)
    expect.set_options(timeout=20000)
    page.goto(site + "/")
    page.fill("input[name=username]", "dad")
    page.fill("input[name=password]", "dad-password-1")
    page.click("button[type=submit]")
    page.wait_for_url(site + "/")

    # 4. His own clock: Tokyo.
    page.goto(site + "/clock")
    page.select_option("#time-zone", "Asia/Tokyo")
    page.click("main button[type=submit]")
    expect(page.locator(".flash-ok")).to_contain_text("Asia/Tokyo")
    shot(page, "clock", width)

    # 2. A step fails: its task waits in Needs you, red, with Retry and Skip.
    failing = make_task(
        step("read", "file.read", args={"path": "note.txt"}, max_attempts=1),
        step("show", args={"value": "${read.content}"}),
        title="Read the note",
    )
    wait_for(lambda: Step.objects.filter(task=failing, key="read", state="failed").exists())
    page.goto(site + "/")
    card = page.locator(".question.kind-failed")
    expect(card).to_contain_text("Read the note")
    expect(card).to_contain_text("Skipping it breaks 1 later step")
    shot(page, "home-failed", width)
    (files / "note.txt").write_text("hello from the note")
    card.get_by_role("button", name="Retry").click()
    expect(page.locator(".flash-ok")).to_contain_text("Trying 'read' again")
    wait_for(lambda: Task.objects.get(pk=failing.pk).state == "done")

    # 5. Following: the counters match the steps after every push; folds and previews.
    followed = make_task(
        *[step(f"wait{n}", "sleep", args={"seconds": 0.4}) for n in range(3)],
        step("pay", "http.post", args={"url": "http://127.0.0.1:9/pay", "json": {"n": 1}},
             confirm_before=True),
        title="Follow me",
    )  # fmt: skip
    page.goto(f"{site}/tasks/{followed.pk}")
    live_open(page)
    pushes = []
    page.on("websocket", lambda ws: ws.on("framereceived", lambda f: pushes.append(f)))
    page.reload()
    live_open(page)
    preview = page.locator(f"#step-{followed.steps.get(key='pay').pk} .preview")
    expect(preview).to_contain_text("http://127.0.0.1:9/pay")
    checked = 0
    while Step.objects.get(task=followed, key="pay").state != "blocked" or checked < len(pushes):
        if checked < len(pushes):
            checked = len(pushes)
            done, shown, total, steps = page.evaluate(COUNTS)
            assert (done, total) == (shown, steps), (done, shown, total, steps)
        else:
            page.wait_for_timeout(30)
    expect(page.locator("#task-counters")).to_contain_text("3 of 4 steps done")
    assert checked >= 1, pushes  # pushes batch events: one or several
    asking = page.locator(f"#step-{followed.steps.get(key='pay').pk} > details")
    expect(asking).to_have_attribute("open", "")
    expect(
        page.locator(f"#step-{followed.steps.get(key='wait0').pk} > details")
    ).not_to_have_attribute("open", "")
    expect(page.locator(".tl-said").first).to_contain_text(" s")
    assert "JST" in (page.locator("#task-head .when").get_attribute("title") or "")
    shot(page, "task", width)
    page.locator("#journal > summary").click()
    page.select_option("select[name=kind]", "step_done")
    page.click(".journal-filter button")
    expect(page.locator("#journal-rows tr")).to_have_count(3)
    expect(page.locator("#journal-rows")).to_contain_text("Step done")

    # 1. The Tasks page: search over outputs, filter by state, counts per state.
    page.goto(site + "/tasks/")
    expect(page.locator(".state-tabs a[data-state=done] .n")).to_have_text("1")
    page.fill("input[name=q]", "hello from the note")
    page.click(".finder button[type=submit]")
    expect(page.locator(".found-row")).to_have_count(1)
    expect(page.locator(".found-row")).to_contain_text("Read the note")
    page.goto(site + "/tasks/?state=blocked")
    expect(page.locator(".found-row")).to_contain_text("Follow me")
    shot(page, "tasks", width)

    # 3. Schedules: made from New task (a flash), in words, next three runs, Run now, off.
    plan = {"title": "Morning note", "schedule": "0 7 * * *", "timezone": "Europe/Berlin",
            "steps": [step("hi")]}  # fmt: skip
    page.goto(site + "/tasks/new")
    page.fill("textarea[name=plan]", json.dumps(plan))
    page.locator("form button.primary").last.click()
    expect(page.locator(".flash-ok")).to_contain_text("every day at 07:00, Europe/Berlin")
    card = page.locator(".schedule-card")
    expect(card.locator(".upcoming .when")).to_have_count(3)
    card.get_by_role("button", name="Run now").click()
    expect(page.locator(".runs li")).to_have_count(1)
    wait_for(lambda: Task.objects.filter(origin_run__schedule__name="Morning note").exists())
    page.locator(".switch").click()
    expect(page.locator(".switch")).to_have_attribute("aria-checked", "false")
    assert not Schedule.objects.get().enabled
    shot(page, "schedules", width)
