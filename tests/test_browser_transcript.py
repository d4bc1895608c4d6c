"""Dad watches Pippa think, in Debian's Chromium (issue 14: "Dad sees Pippa think"): a real
daphne, a real `runloop` process, the scripted model server and a real SMTP receiver. The
task page's step card shows the model's transcript growing live; the "May I do this?" card
shows the model's email (recipients, subject, body); Allow sends exactly that mail, once.
Screenshots in test-artifacts/."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User

from loop.models import Step, StepState

from .conftest import make_task, process_env, wait_for
from .support.llm_server import ModelServer, calls, commit, tool_results
from .support.sinks import Mailbox
from .test_browser import (  # noqa: F401  (fixtures)
    ARTIFACTS,
    browser,
    dad_user,
    launched_chromium,
    live_open,
    log_in,
    runloop,
    shot,
    site,
    still_same_page,
)
from .test_model_judge_crash import mailbox  # noqa: F401  (fixture: the real SMTP receiver)

# what a person sees: tried on the SQLite run
pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.sqlite_only,
]

LETTER = {
    "to": ["dad@example.com", "mum@example.com"],
    "subject": "The week ahead",
    "body": "Dentist on Tuesday at 9:00.\nBins go out on Thursday.",
}


@pytest.fixture
def model(settings: Any) -> Iterator[ModelServer]:
    """The scripted model server (its script set by the test); plans with model steps are
    accepted here while it runs."""
    with ModelServer([]) as server:
        settings.LOOP_LLM_BASE_URL = server.base_url
        yield server


@pytest.fixture
def worker_env(
    model: ModelServer,
    mailbox: tuple[Mailbox, str, int],  # noqa: F811
) -> dict[str, str]:
    """test_browser's `runloop` runs with this: pointed at the model and the SMTP receiver."""
    _, host, port = mailbox
    return process_env(
        LOOP_IDLE_SLEEP_MS="50",
        LOOP_HEARTBEAT_SECONDS="1",
        LOOP_LLM_BASE_URL=model.base_url,
        LOOP_RETRY_BASE_SECONDS="0",
        EMAIL_HOST=host,
        EMAIL_PORT=str(port),
    )


def test_dad_watches_the_transcript_grow_and_allows_the_models_email_once(
    site: str,  # noqa: F811
    model: ModelServer,
    mailbox: tuple[Mailbox, str, int],  # noqa: F811
    runloop: Any,  # noqa: F811
    browser: Any,  # noqa: F811
    dad_user: User,  # noqa: F811
) -> None:
    from playwright.sync_api import expect

    box, _, _ = mailbox
    # Each of the model's first two answers waits until Dad's page has shown the one before,
    # so what he sees arrives while he watches, not before he opened the page.
    looked, may_mail = threading.Event(), threading.Event()

    def script(body: dict[str, Any], n: int) -> Any:
        done = tool_results(body["messages"])
        if not done:
            assert looked.wait(60)
            return calls(
                ("echo", {"value": {"calendar": ["dentist Tue 9:00", "bins Thu"]}}),
                text="Let me read the calendar first.",
            )
        if len(done) == 1:
            assert may_mail.wait(60)
            return calls(("email_send", LETTER), text="Now I will mail Dad and Mum.")
        return commit(output={"mailed": done[-1]})

    model.script = script
    task = make_task(
        {
            "key": "mail",
            "title": "Mail the week ahead",
            "judge": "model",
            "instructions": "Read the calendar, then mail Dad and Mum what is coming.",
            "tools": ["echo", "email.send"],
            "side_effect": True,
            "confirm_before": True,
        },
        title="The week ahead",
    )
    step = task.steps.get()
    page = log_in(browser, site, "dad", "dad-password-1")
    blocked: list[str] = []  # the Content-Security-Policy allows no inline script or style
    page.on("console", lambda m: blocked.append(m.text) if "Content Security" in m.text else None)
    page.goto(f"{site}/tasks/{task.pk}")
    live_open(page)
    page.evaluate("window.__noReload = true")
    card = page.locator(f"#step-{step.pk}")
    said = card.locator(f"#transcript-{step.pk}")
    expect(said).to_contain_text("Attempt 1")  # the worker started it: system, briefing
    expect(said).not_to_contain_text("Let me read the calendar first.")

    looked.set()
    expect(said.locator(".tx-assistant").first).to_contain_text("Let me read the calendar first.")
    first_call = said.locator(".tx-call").first
    expect(first_call).to_contain_text("echo")
    expect(first_call.locator(".tx-args")).to_contain_text('"dentist Tue 9:00"')
    expect(first_call.locator(".tx-result")).to_contain_text("bins Thu")  # its result, live
    expect(card.locator(".step-head .tokens-sum")).to_contain_text("tokens")
    expect(page.locator("#task-head .task-tokens")).to_contain_text("Pippa used")
    assert still_same_page(page)
    shot(page, "transcript-growing.png")

    may_mail.set()
    question = card.locator(f"#question-{step.pk}")
    expect(question).to_contain_text("May I do this?")
    fields = question.locator(".request-fields")
    expect(question.locator(".request-head")).to_contain_text("email.send")
    for text in ("dad@example.com, mum@example.com", "The week ahead", "Dentist on Tuesday"):
        expect(fields).to_contain_text(text)
    expect(fields).to_contain_text("Bins go out on Thursday.")
    mail_call = said.locator(".tx-call").nth(1)
    expect(mail_call).to_contain_text("email_send")
    expect(mail_call).to_contain_text("no result yet")
    expect(said).to_contain_text("Now I will mail Dad and Mum.")
    assert box.messages == []
    ARTIFACTS.mkdir(exist_ok=True)
    card.screenshot(path=str(ARTIFACTS / "transcript-may-i.png"))

    question.get_by_role("button", name="Allow once").click()
    expect(page.locator("#flash")).to_contain_text("Allowed once")
    expect(card.locator(".step-head .pill").first).to_have_text("Done", timeout=30000)
    mail_call = said.locator(".tx-call").nth(1)
    expect(mail_call.locator(".tx-result")).to_contain_text("message_id")
    expect(mail_call.locator(".tx-effect .pill")).to_have_text("Succeeded")
    expect(said).to_contain_text("committed: done")
    expect(page.locator("#task-head")).to_contain_text("Done")
    assert still_same_page(page)

    wait_for(lambda: len(box.messages) >= 1, timeout=30)
    assert len(box.messages) == 1
    [letter] = box.messages
    assert letter["Subject"] == "The week ahead"
    assert "dad@example.com" in letter["To"] and "mum@example.com" in letter["To"]
    assert Step.objects.get(pk=step.pk).state == StepState.DONE
    shot(page, "transcript-done.png")

    page.goto(f"{site}/steps/{step.pk}/transcript")  # the whole transcript, every entry
    expect(page.locator(f"#transcript-{step.pk}")).to_contain_text("committed: done")
    expect(page.locator(f"#transcript-{step.pk} .tx-attempt")).to_have_count(2)
    assert blocked == []
    assert len(box.messages) == 1  # nothing more went out
