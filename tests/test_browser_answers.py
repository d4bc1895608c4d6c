"""Answers that talk back, in Chromium (DESIGN.md §17), with a real daphne, one real `runloop`
and the scripted model server:

- Edit, then allow: Dad changes the amount in the card; the receiver gets the edited call, once.
- Reply, then Deny with a reason, to Pippa's call: each reaches her as the call's result (the
  transcript shows it), she goes on, and the task is done, not failed; nothing was sent.
- A repeat is named: "This exact call already happened at HH:MM (receipt …)".
- The conversation page on a 390-px phone: Dad's and Pippa's voices, her proposal as a card he
  approves in place, no sideways scrolling.
Screenshots in test-artifacts/.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from loop import actions, conversation, transcript, turns
from loop.models import AuthorKind, Event, Message, Step, Task, TaskState
from loop.permissions import Pippa

from .conftest import make_task, model_env, start_runloop, step, wait_for
from .support.llm_server import ModelServer, call, commit, tool_results
from .support.sinks import Receiver
from .test_browser import (  # noqa: F401  (fixtures)
    browser,
    dad_user,
    launched_chromium,
    live_open,
    log_in,
    shot,
    site,
    still_same_page,
)
from .test_talk import step_key

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_edit_reply_deny_and_the_repeat_warning_in_the_card(
    site: str,  # noqa: F811
    browser: Any,  # noqa: F811
    dad_user: User,  # noqa: F811
    processes: list[subprocess.Popen[bytes]],
    tmp_path: Path,
    settings: Any,
) -> None:
    from playwright.sync_api import expect

    with Receiver() as sink:
        url = sink.url("/pay")

        def script(body: dict[str, Any], n: int) -> Any:
            key, done = step_key(body), tool_results(body["messages"])
            if key == "ask":  # Dad replies, then denies with a reason
                if not done:
                    return call("http_post", url=url, json={"n": 1})
                if len(done) == 1:
                    assert "Use two." in done[0]
                    return call("http_post", url=url, json={"n": 2})
                assert "Not today." in done[1]
                return commit(output="not sent: Dad said not today")
            if key == "again":  # the same call three times: the third asks "again?"
                if len(done) < 3:
                    return call("http_post", url=url, json={"n": 3})
                return commit(output="once is enough")
            raise AssertionError(key)

        with ModelServer(script) as model:
            settings.LOOP_LLM_BASE_URL = model.base_url
            edit = make_task(
                step(
                    "pay",
                    "http.post",
                    args={"url": url, "json": {"amount": 120}},
                    confirm_before=True,
                    title="Pay the plumber",
                ),
                title="Pay the plumber",
            )
            ask = make_task(
                {
                    "key": "ask",
                    "judge": "model",
                    "instructions": "Pay.",
                    "tools": ["http.post"],
                    "side_effect": True,
                    "confirm_before": True,
                },
                title="Pippa pays",
            )
            again = make_task(
                {
                    "key": "again",
                    "judge": "model",
                    "instructions": "Pay once.",
                    "tools": ["http.post"],
                    "side_effect": True,
                },
                title="Pippa pays again",
            )
            env = model_env(model, LOOP_HEARTBEAT_SECONDS="1")
            processes.append(start_runloop(env=env, log=tmp_path / "runloop.log"))
            page = log_in(browser, site, "dad", "dad-password-1")

            # Edit, then allow: the receiver gets the edited call, once.
            pay = edit.steps.get()
            card = page.locator(f"#question-{pay.pk}")
            expect(card).to_contain_text("May I do this?")
            card.locator("summary", has_text="Edit, then allow").click()
            page.set_viewport_size({"width": 390, "height": 844})  # Dad's phone
            assert page.evaluate("document.documentElement.scrollWidth") <= 390
            shot(page, "answers-phone.png")
            page.set_viewport_size({"width": 1280, "height": 900})
            card.locator(f"#arg-{pay.pk}-json").fill('{"amount": 90}')
            shot(page, "answers-edit-then-allow.png")
            card.get_by_role("button", name="Allow this call once").click()
            expect(page.locator("#flash")).to_contain_text("as you edited it")
            wait_for(lambda: Task.objects.get(pk=edit.pk).state == TaskState.DONE, timeout=60)
            paid = [json.loads(p.body) for p in sink.posts]
            assert [b for b in paid if "amount" in b] == [{"amount": 90}]  # ("again" runs too)
            [edited] = Event.objects.filter(step=pay, kind="step_edited")
            assert edited.data["before"]["json"] == {"amount": 120}
            assert edited.data["after"]["json"] == {"amount": 90}

            # Reply: the words reach Pippa as the call's result; she asks again.
            asking = ask.steps.get()
            card = page.locator(f"#question-{asking.pk}")
            expect(card).to_contain_text('"n": 1')
            card.locator("[name=note]").fill("Use two.")
            card.get_by_role("button", name="Reply").click()
            expect(card).to_contain_text('"n": 2')
            # Deny, with a reason: the reason is the call's result, Pippa goes on.
            card.locator("[name=note]").fill("Not today.")
            card.get_by_role("button", name="Deny").click()
            wait_for(lambda: Task.objects.get(pk=ask.pk).state == TaskState.DONE, timeout=60)
            results = [
                e.content for e in transcript.entries(asking) if e.role == transcript.Role.TOOL
            ]
            assert results[1] == f"{actions.DENIED} Not today."
            page.goto(f"{site}/tasks/{ask.pk}")
            expect(page.locator("body")).to_contain_text(
                "Dad denied this call. His reason: Not today."
            )

            # The repeat is named, with its receipt.
            repeat = again.steps.get()
            page.goto(site + "/")
            card = page.locator(f"#question-{repeat.pk}")
            expect(card.locator(".repeat")).to_contain_text("This exact call already happened at")
            expect(card.locator(".repeat")).to_contain_text("(receipt ")
            shot(page, "answers-repeat.png")
            card.locator("[name=note]").fill("It went out already.")
            card.get_by_role("button", name="Deny").click()
            wait_for(lambda: Task.objects.get(pk=again.pk).state == TaskState.DONE, timeout=60)
    # One post from the edited call and one from Pippa's first repeat: nothing else went out.
    bodies = sorted(json.dumps(json.loads(p.body)) for p in sink.posts)
    assert bodies == ['{"amount": 90}', '{"n": 3}']


def test_the_conversation_on_a_phone(
    site: str,  # noqa: F811
    browser: Any,  # noqa: F811
    dad_user: User,  # noqa: F811
    settings: Any,
) -> None:
    from playwright.sync_api import expect

    settings.LOOP_LLM_BASE_URL = "http://127.0.0.1:9/v1"  # nobody answers: no worker runs
    task = make_task({"key": "reply", "judge": "model", "instructions": "Reply."}, title="Reply")
    Task.objects.filter(pk=task.pk).update(origin="conversation")
    reply = Step.objects.select_related("task").get(task=task)
    dad_says, turn = turns.post(
        author="dad", text="Please water the roses tomorrow.", user=dad_user
    )
    assert turn is None  # a task of Pippa's is under way: it reads the message
    conversation.post(
        author="Pippa",
        kind=AuthorKind.PIPPA,
        text="Gladly. Here is a plan: water the roses at six.",
        user=Pippa(task.pk, reply.key, 1),
        task_id=task.pk,
    )
    water = {"key": "water", "tool": "echo", "args": {"value": "roses"}}
    proposed = turns.propose(reply, {"title": "Water the roses", "steps": [water]})

    page = log_in(browser, site, "dad", "dad-password-1")
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(site + "/conversation")
    live_open(page)
    expect(page.locator(f"#message-{dad_says.pk}")).to_have_class(re.compile("voice-dad"))
    expect(page.locator(".message.voice-pippa").first).to_contain_text("Gladly.")
    card = page.locator(f"#plan-waits-{proposed.pk}")
    expect(card).to_contain_text("Water the roses")
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    shot(page, "conversation-phone.png")
    # What Pippa says (the say tool's path) arrives live, at the bottom.
    conversation.post(
        author="Pippa",
        kind=AuthorKind.PIPPA,
        text="I will water them at six.",
        user=Pippa(task.pk, reply.key, 1),
        task_id=task.pk,
    )
    expect(page.locator(".message").last).to_contain_text("I will water them at six.")
    card.get_by_role("button", name="Approve the plan").click()
    said = Message.objects.get(proposal=proposed)
    expect(page.locator(f"#message-{said.pk} .proposal-state")).to_contain_text("running")
    assert Task.objects.get(pk=proposed.pk).state == TaskState.RUNNING
    page.set_viewport_size({"width": 1280, "height": 900})
    shot(page, "conversation-wide.png")
