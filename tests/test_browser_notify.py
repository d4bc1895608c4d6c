"""Dad is told, and a failure says what to do (issue 27), in Chromium against a real daphne and
a real `runloop`: a new question in a background tab fires a browser notification (permission
granted) and is announced; with daphne killed, "Allow once" says it was not sent, where it was
clicked, and the offline bar says answers won't reach Pippa; with daphne back the bar goes and
the `a` key on the focused question answers it."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command

from loop.models import Step, StepState

from .conftest import make_task, step, wait_for
from .test_browser import (  # noqa: F401  (fixtures)
    ARTIFACTS,
    browser,
    dad_user,
    free_port,
    launched_chromium,
    live_open,
    runloop,
    site,
    start_daphne,
    worker_env,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.sqlite_only]

# Records each notification the page makes, and makes it all the same.
SPY = """
(() => {
  const Real = window.Notification;
  if (!Real) return;
  window.__notes = [];
  class Spy extends Real {
    constructor(title, options) {
      super(title, options);
      window.__notes.push({ title: title, body: (options && options.body) || "" });
    }
  }
  Spy.requestPermission = Real.requestPermission.bind(Real);
  Object.defineProperty(Spy, "permission", { get: () => Real.permission });
  window.Notification = Spy;
})();
"""


def test_told_in_the_background_and_a_dead_server_is_said_where_dad_clicked(
    browser: Any,  # noqa: F811
    dad_user: User,  # noqa: F811
    runloop: Any,  # noqa: F811
    processes: list[subprocess.Popen[bytes]],
    tmp_path: Path,
) -> None:
    from playwright.sync_api import expect

    call_command("collectstatic", interactive=False, verbosity=0)
    port = free_port()
    here = f"http://127.0.0.1:{port}"
    server = start_daphne(port, tmp_path / "daphne.log")
    processes.append(server)
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.grant_permissions(["notifications"], origin=here)
    context.add_init_script(SPY)
    page = context.new_page()
    page.set_default_timeout(15000)
    expect.set_options(timeout=15000)
    page.goto(here + "/")
    page.fill("input[name=username]", "dad")
    page.fill("input[name=password]", "dad-password-1")
    page.click("button[type=submit]")
    page.wait_for_url(here + "/")
    live_open(page)
    expect(page.locator("#notify-ask")).to_have_text("Notifications on")
    # Another tab in front: the dashboard's is in the background.
    other = context.new_page()
    other.goto(here + "/healthz")
    other.bring_to_front()
    # Headless Chromium tells every page it has the focus (Playwright emulates it); without
    # that emulation the page in the background knows it is not in front.
    cdp = context.new_cdp_session(page)
    cdp.send("Emulation.setFocusEmulationEnabled", {"enabled": False})
    assert page.evaluate("document.hidden || !document.hasFocus()")

    task = make_task(
        step(
            "pay", "file.write", args={"path": "bill.txt", "content": "pay it"}, confirm_before=True
        ),
        title="Pay the plumber",
    )
    pay = task.steps.get()
    card = page.locator(f"#question-{pay.pk}")
    expect(card).to_be_visible()
    wait_for(lambda: page.evaluate("window.__notes.length"), timeout=10)
    notes = page.evaluate("window.__notes")
    assert notes == [
        {
            "title": "Pippa asks: May I do this? — Pay the plumber",
            "body": "May I do this? — Pay the plumber",
        }
    ]
    expect(page.locator("#announcer")).to_have_text(
        "New question: May I do this? — Pay the plumber"
    )
    expect(card.locator(".asked")).to_contain_text(
        "asked just now · why: the first run of a step marked to ask"
    )

    page.bring_to_front()
    os.kill(server.pid, signal.SIGKILL)
    server.wait()
    card.get_by_role("button", name="Allow once").click()
    expect(card.locator(".click-error")).to_have_text(
        "Not sent: the server cannot be reached, so nothing was decided. "
        "Click again once the bar at the top is gone."
    )
    bar = page.locator("#offline-bar")
    expect(bar).to_have_text("Reconnecting…")
    expect(bar).to_contain_text("Offline — answers won't reach Pippa", timeout=20000)
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "notify-offline-1280.png"), full_page=True)
    page.set_viewport_size({"width": 390, "height": 844})
    page.screenshot(path=str(ARTIFACTS / "notify-offline-390.png"), full_page=True)
    page.set_viewport_size({"width": 1280, "height": 900})
    assert Step.objects.get(pk=pay.pk).state == StepState.BLOCKED  # nothing was decided

    processes.append(start_daphne(port, tmp_path / "daphne.log"))
    live_open(page)
    expect(bar).to_be_hidden(timeout=20000)
    card.focus()
    page.keyboard.press("a")
    expect(card.locator(".click-error")).to_have_count(0)
    wait_for(lambda: Step.objects.get(pk=pay.pk).state != StepState.BLOCKED, timeout=20)
    expect(page.locator("#flash")).to_contain_text("Allowed once")
    context.close()


def test_an_answer_given_elsewhere_meanwhile_is_said_where_dad_clicked(
    browser: Any,  # noqa: F811
    dad_user: User,  # noqa: F811
    site: str,  # noqa: F811
) -> None:
    """The live feed held back (a silent socket), so the card stays after the question was
    answered at the shell: "Allow once" gets the server's real 409, said in the card."""
    from playwright.sync_api import expect

    from loop import actions
    from loop.permissions import SYSTEM
    from loop.worker import Worker

    task = make_task(
        step("pay", "file.write", args={"path": "b.txt", "content": "x"}, confirm_before=True)
    )
    runner = Worker(label="in-test")
    runner.boot()
    runner.tick()
    pay = task.steps.get()
    assert Step.objects.get(pk=pay.pk).state == StepState.BLOCKED
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.route_web_socket("**/ws/live*", lambda ws: None)  # open, and never a message
    page.set_default_timeout(15000)
    page.goto(site + "/")
    page.fill("input[name=username]", "dad")
    page.fill("input[name=password]", "dad-password-1")
    page.click("button[type=submit]")
    page.wait_for_url(site + "/")
    card = page.locator(f"#question-{pay.pk}")
    expect(card).to_be_visible()
    actions.unblock(step_id=pay.pk, decision="deny", actor="shell", user=SYSTEM)
    card.get_by_role("button", name="Allow once").click()
    expect(card.locator(".click-error")).to_contain_text(
        "Already decided elsewhere, or no longer possible: decision:"
    )
    context.close()
