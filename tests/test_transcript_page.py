"""Dad sees Pippa think (issue 14, item 8): a model step's card on the task page shows its
transcript — the model's words, each call with its arguments and its result, the effect and
receipt of a side-effect call, the tokens per reply, per step and per task — escaped, bounded
in statements and in size, and pushed live as the worker commits entries."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from django.contrib.auth.models import User
from django.core import mail as outbox
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from loop import transcript
from loop.models import Effect, Event, Step, StepState, Task, TranscriptEntry
from loop.web import live
from loop.web.pages.transcript_view import SHOWN
from loop.worker import Worker

from .conftest import make_task, run_until_idle
from .support.llm_server import call, calls, commit, tool_results
from .test_dashboard_pages import logged_in
from .test_live_consumer import connect_as, own_channel_layer  # noqa: F401  (fixture)

pytestmark = [pytest.mark.django_db, pytest.mark.sqlite_only]
# the transcript page: tried on the SQLite run

LETTER = {"to": ["dad@example.com"], "subject": "This week", "body": "Dentist on Tuesday."}


@pytest.fixture
def configured(settings: Any) -> None:
    """A model is configured (a plan with a model step is refused otherwise); nothing here
    asks it anything."""
    settings.LOOP_LLM_BASE_URL = "http://127.0.0.1:9/v1"


def model_task(key: str = "think", **fields: Any) -> Task:
    return make_task(
        {"key": key, "judge": "model", "instructions": "Think it through.", **fields},
        title="Pippa thinks",
    )


def page_of(user: User, task: Task) -> str:
    response = logged_in(user).get(reverse("loop:task", args=[task.pk]))
    assert response.status_code == 200
    return response.content.decode()


class _Element(HTMLParser):
    """Finds where the element with a given id ends (its tag's nesting counted)."""

    def __init__(self, dom_id: str) -> None:
        super().__init__(convert_charrefs=False)
        self.dom_id, self.tag, self.depth, self.end = dom_id, "", 0, -1

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if self.tag == tag:
            self.depth += 1
        elif not self.tag and ("id", self.dom_id) in attrs:
            self.tag, self.depth = tag, 1

    def handle_endtag(self, tag: str) -> None:
        if self.tag == tag and self.depth > 0:
            self.depth -= 1
            if self.depth == 0 and self.end < 0:
                line, column = self.getpos()
                lines = self.rawdata.splitlines(keepends=True)
                self.end = sum(len(x) for x in lines[: line - 1]) + column


def element(page: str, dom_id: str) -> str:
    """The HTML of the element with that id, as the page has it."""
    finder = _Element(dom_id)
    finder.feed(page)
    start = page.index(f'id="{dom_id}"')
    assert finder.end > start, dom_id
    return page[start : finder.end]


def card_of(page: str, step: Step) -> str:
    """The step's card (its <li>) in the page."""
    return element(page, f"step-{step.pk}")


def turns(step: Step, count: int, *, attempt: int = 1) -> None:
    """`count` replies of the model, each calling echo, each call with its result."""
    Step.objects.filter(pk=step.pk).update(attempts=attempt)
    step.refresh_from_db()
    for n in range(count):
        transcript.add_reply(
            step,
            f"turn {attempt}.{n}: looking",
            [{"id": f"c{attempt}.{n}", "name": "echo", "arguments": json.dumps({"value": n})}],
            prompt_tokens=100,
            completion_tokens=7,
        )
        transcript.add_result(step, f"c{attempt}.{n}", f'{{"value": {n}}}')


def test_a_model_steps_card_shows_its_words_calls_results_effect_and_tokens(
    llm: Any,  # noqa: F811
    worker: Worker,
    dad: User,
) -> None:
    def script(body: dict[str, Any], n: int) -> Any:
        done = tool_results(body["messages"])
        if not done:
            return calls(("echo", {"value": {"calendar": "dentist Tuesday"}}), text="Let me read.")
        if len(done) == 1:
            return call("email_send", **LETTER)
        return commit(output={"mailed": True})

    llm(script)
    task = model_task("mail", tools=["echo", "email.send"], side_effect=True)
    run_until_idle(worker)
    step = task.steps.get()
    assert step.state == StepState.DONE and len(outbox.outbox) == 1
    effect = Effect.objects.get(step=step)
    rows = transcript.entries(step)
    prompt = sum(r.prompt_tokens for r in rows)
    completion = sum(r.completion_tokens for r in rows)
    assert prompt > 0 and completion > 0

    page = page_of(dad, task)
    card = card_of(page, step)
    assert "Pippa's transcript" in card and "Attempt 1" in card
    assert '<details class="tx-system"' in card  # the system message folded away
    assert "Let me read." in card
    # each call with its arguments (pretty JSON, escaped) and its result under it
    assert "<code>echo</code>" in card and "<code>email_send</code>" in card
    assert "(email.send)" in card
    assert "&quot;calendar&quot;: &quot;dentist Tuesday&quot;" in card
    # a tool's call as its "May I do this?" shows it: the email's fields, by name
    mail = card.split("<code>email_send</code>", 1)[1]
    assert "<dt>Subject</dt>" in mail and "This week" in mail.split("<dt>Subject</dt>", 1)[1]
    assert "committed: done" in card
    # the effect of the email call, its state and receipt
    assert f"{effect.pk[:8]}…" in card and 'class="pill pill-succeeded"' in card
    assert "message_id" in card.split(f'title="{effect.pk}"', 1)[1]
    # tokens: per reply, per step (its head), per task (the page's head)
    for reply in (r for r in rows if r.role == "assistant"):
        assert f"{reply.prompt_tokens} prompt + {reply.completion_tokens} completion" in card
    assert f"{prompt} + {completion} tokens" in card
    head = element(page, "task-head")
    assert f'Pippa used <span class="tokens">{prompt} prompt + {completion} completion' in head


def test_hostile_model_text_is_shown_escaped_never_as_markup(configured: None, dad: User) -> None:
    task = model_task()
    step = task.steps.get()
    transcript.add(step, "system", "You are Pippa.")
    transcript.add_reply(
        step,
        "<script>alert('reply')</script>",
        [
            {
                "id": "a",
                "name": "echo",
                "arguments": json.dumps({"value": "<img src=x onerror=1>"}),
            },
            {"id": "b", "name": "<b>odd</b>", "arguments": "{not json <i>"},
        ],
    )
    transcript.add_result(step, "a", "</pre><script>alert('result')</script>")
    page = page_of(dad, task)
    assert "<script>alert" not in page and "<img src=x" not in page
    assert "<b>odd" not in page and "<i>" not in page
    card = card_of(page, step)
    assert "&lt;script&gt;alert(&#x27;reply&#x27;)&lt;/script&gt;" in card
    assert "&lt;/pre&gt;&lt;script&gt;alert(&#x27;result&#x27;)" in card
    assert "&lt;img src=x onerror=1&gt;" in card
    assert "{not json &lt;i&gt;" in card  # arguments that are not JSON: as the model wrote them
    assert "no result yet" in card  # call b waits for its result


def test_a_call_is_shown_as_its_question_shows_it_secrets_by_name(
    configured: None, dad: User
) -> None:
    """What Pippa wrote is shown in full, headers too; only a secret is shown by its name."""
    task = model_task()
    step = task.steps.get()
    headers = {"Authorization": "Bearer ${secret:PAY_TOKEN}", "X-Trace": "visible-value"}
    args = {"url": "http://127.0.0.1:9/hook", "headers": headers, "json": {"a": 1}}
    transcript.add_reply(
        step, "", [{"id": "a", "name": "http_post", "arguments": json.dumps(args)}]
    )
    card = card_of(page_of(dad, task), step)
    assert "POST http://127.0.0.1:9/hook" in card and "X-Trace: visible-value" in card
    assert "Authorization: Bearer [secret PAY_TOKEN]" in card


def test_a_long_result_folds_with_a_note_and_the_whole_text_is_in_the_page(
    configured: None, dad: User
) -> None:
    task = model_task()
    step = task.steps.get()
    transcript.add_reply(step, "", [{"id": "a", "name": "echo", "arguments": "{}"}])
    long = "line of text\n" * 400
    transcript.add_result(step, "a", long)
    card = card_of(page_of(dad, task), step)
    assert "Show all 5,200 characters, 401 lines" in card
    assert long in card  # the whole text, in its fold


def test_attempts_are_apart_and_a_long_transcript_shows_its_latest_entries(
    configured: None, dad: User
) -> None:
    task = model_task()
    step = task.steps.get()
    turns(step, 5, attempt=1)
    turns(step, 40, attempt=2)
    total = TranscriptEntry.objects.filter(step=step).count()
    card = card_of(page_of(dad, task), step)
    assert card.count('class="tx-entry ') <= SHOWN
    assert "turn 2.39: looking" in card and "turn 1.0: looking" not in card
    assert f"{total - SHOWN} earlier entries are not shown here" in card
    link = reverse("loop:transcript", args=[step.pk])
    assert f'href="{link}">show all {total}</a>' in card
    assert f"{45 * 100} + {45 * 7} tokens" in card  # summed over all, not only those shown

    whole = logged_in(dad).get(link).content.decode()
    assert "turn 1.0: looking" in whole and "turn 2.39: looking" in whole
    assert whole.index('data-attempt="1"') < whole.index('data-attempt="2"')
    assert "earlier entries" not in whole


def test_the_task_page_reads_a_constant_number_of_statements_whatever_the_transcripts(
    configured: None, dad: User
) -> None:
    def statements(task: Task) -> list[str]:
        client = logged_in(dad)
        url = reverse("loop:task", args=[task.pk])
        with CaptureQueriesContext(connection) as captured:
            assert client.get(url).status_code == 200
        return [q["sql"] for q in captured.captured_queries]

    def two_model_steps(title: str) -> Task:
        return make_task(
            {"key": "a", "judge": "model", "instructions": "A."},
            {"key": "b", "judge": "model", "instructions": "B."},
            title=title,
        )

    small, big = two_model_steps("small"), two_model_steps("big")
    for task, count in ((small, 2), (big, 150)):
        for one in task.steps.all():
            turns(one, count)
    few, many = statements(small), statements(big)
    assert len(many) == len(few), (len(few), len(many))
    # the transcripts cost three statements, however many steps and entries: the latest
    # entries of every step shown, their counts and token sums per step, the task's sums
    # (the effects they name were read for the step cards already)
    said = [sql for sql in many if '"loop_transcriptentry"' in sql]
    assert len(said) == 3, said
    assert sum('"loop_effect"' in sql for sql in many) == 1


def test_may_i_about_the_models_email_shows_it_and_allow_sends_exactly_that_once(
    llm: Any,  # noqa: F811
    worker: Worker,
    dad: User,
) -> None:
    def script(body: dict[str, Any], n: int) -> Any:
        done = tool_results(body["messages"])
        if not done:
            return calls(("email_send", LETTER), text="I will mail Dad.")
        return commit(output={"sent": done[-1]})

    llm(script)
    task = model_task("mail", tools=["email.send"], side_effect=True, confirm_before=True)
    run_until_idle(worker)
    step = task.steps.get()
    assert step.state == StepState.BLOCKED and step.question_kind == "may_i"
    for url in (reverse("loop:task", args=[task.pk]), reverse("loop:home")):
        page = logged_in(dad).get(url).content.decode()
        card = element(page, f"question-{step.pk}")
        assert "May I do this?" in card and "<code>email.send</code>" in card
        fields = dict(re.findall(r"<dt>(.*?)</dt>\s*<dd[^>]*>(.*?)</dd>", card, re.S))
        assert "dad@example.com" in fields["To"]
        assert fields["Subject"] == "This week" and "Dentist on Tuesday." in fields["Body"]
        assert "Allow once" in card
    card = card_of(page_of(dad, task), step)
    assert "I will mail Dad." in card and "no result yet" in card
    assert outbox.outbox == []

    answered = logged_in(dad).post(reverse("loop:decide", args=[step.pk]), {"decision": "allow"})
    assert answered.status_code in (200, 204, 302)
    run_until_idle(worker)
    step.refresh_from_db()
    assert step.state == StepState.DONE
    assert [m.subject for m in outbox.outbox] == ["This week"]
    assert outbox.outbox[0].to == ["dad@example.com"]
    effect = Effect.objects.get(step=step)
    card = card_of(page_of(dad, task), step)
    assert "no result yet" not in card and "committed: done" in card
    assert f"{effect.pk[:8]}…" in card and "pill-succeeded" in card


def test_the_whole_transcript_page_needs_a_login_and_a_step(configured: None, dad: User) -> None:
    from django.test import Client

    step = model_task().steps.get()
    url = reverse("loop:transcript", args=[step.pk])
    assert Client().get(url).status_code == 302
    assert logged_in(dad).post(url).status_code == 405
    assert logged_in(dad).get(reverse("loop:transcript", args=[step.pk + 99])).status_code == 404
    assert "This step has no transcript." in logged_in(dad).get(url).content.decode()


@pytest.mark.django_db(transaction=True)
def test_entries_are_pushed_live_and_a_reconnecting_page_catches_up(
    configured: None, dad: User
) -> None:
    task = model_task()
    step = task.steps.get()
    db = database_sync_to_async

    def card(message: dict[str, Any]) -> str:
        # the step's card, or the whole list of steps when the push also carries the plan's
        # first events (the tailer's first look may come after the reply's commit)
        parts = (f"step-{step.pk}", "steps")
        return "".join(s["html"] for s in message["swaps"] if s["id"] in parts)

    async def until_card_says(communicator: Any, text: str) -> dict[str, Any]:
        while True:
            message = await communicator.receive_json_from(timeout=5)
            if text in card(message):
                return message

    async def scenario() -> None:
        start = await db(lambda: Event.objects.latest("id").pk)()
        page = await connect_as(dad, f"topic=task-{task.pk}&after={start}")
        await page.receive_json_from(timeout=5)  # the replay of the page as it is
        await db(transcript.add_reply)(
            step, "First I look <here>.", [{"id": "x", "name": "echo", "arguments": "{}"}]
        )
        got = await until_card_says(page, "First I look &lt;here&gt;.")
        assert "no result yet" in card(got)
        await db(transcript.add_result)(step, "x", "looked: fine")
        got = await until_card_says(page, "looked: fine")
        last = max(got["events"])
        await page.disconnect()

        # Away: the model goes on; a reconnect from the last id it saw gets the card as now.
        await db(transcript.add_reply)(step, "Now I am sure.", [])
        again = await connect_as(dad, f"topic=task-{task.pk}&after={last}")
        replay = await again.receive_json_from(timeout=5)
        # a replay renders the page's steps whole, each card with its transcript as it is now
        steps = next(s["html"] for s in replay["swaps"] if s["id"] == "steps")
        assert "Now I am sure." in steps and "looked: fine" in steps
        await again.disconnect()
        await live.tailer().stop()

    async_to_sync(scenario)()
