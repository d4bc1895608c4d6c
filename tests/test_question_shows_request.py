"""The question shows the request: Dad decides on what will be sent, in full — an email's
recipients and whole body, an HTTP call's URL, headers and JSON, a file's path and content —
the same on the dashboard, in `manage.py task` and in the API's JSON (DESIGN.md §5)."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import dj_database_url
import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client
from django.urls import reverse
from django.utils.html import escape

from loop import tools
from loop.api.core import issue
from loop.models import Effect, Step, Task
from loop.tools.shown import Field
from loop.worker import Worker

from .conftest import make_task, run_until_idle, step


def long_body(size: int = 2000) -> str:
    """A body of exactly `size` characters over many lines, with what a page must escape."""
    lines, i = [], 0
    while sum(len(line) + 1 for line in lines) < size:
        i += 1
        lines.append(f'Line {i:03d}: the plumber\'s <b>invoice</b> & "quote" for the sink.')
    return "\n".join(lines)[: size - len("END-OF-BODY")] + "END-OF-BODY"


BODY = long_body()
NESTED = {
    "invoice": {"id": "INV-7", "lines": [{"item": "sink", "amount": 120, "tags": ["<b>"]}]},
    "payer": {"name": "Dad", "address": {"city": "Leeds", "notes": "ring twice & wait"}},
}

EMAIL = step(
    "mail",
    "email.send",
    args={
        "to": ["plumber@example.com", "office@example.com"],
        "cc": ["mum@example.com"],
        "from": "dad@example.com",
        "subject": "Your invoice <INV-7>",
        "body": BODY,
    },
    confirm_before=True,
)
POST = step(
    "pay",
    "http.post",
    args={
        "url": "http://127.0.0.1:9/pay?ref=INV-7",
        "headers": {"X-Request-Source": "pippa", "Authorization": "Bearer s3cr3t-t0ken"},
        "json": NESTED,
    },
    confirm_before=True,
)
WRITE = step(
    "note",
    "file.write",
    args={"path": "notes/plumber.txt", "content": BODY},
    confirm_before=True,
)

# What each call must show, whole: (label, text).
EXPECTED = {
    "email.send": [
        ("To", "plumber@example.com, office@example.com"),
        ("Cc", "mum@example.com"),
        ("From", "dad@example.com"),
        ("Subject", "Your invoice <INV-7>"),
        ("Body", BODY),
    ],
    "http.post": [
        ("Request", "POST http://127.0.0.1:9/pay?ref=INV-7"),
        ("JSON body", json.dumps(NESTED, indent=2)),
    ],
    "file.write": [("Path", "notes/plumber.txt"), ("Content", BODY)],
}


@pytest.fixture
def agent_client(dad: User) -> Client:
    _, token = issue(name="pippa", user=dad)
    return Client(HTTP_AUTHORIZATION=f"Bearer {token}")


def asked(plan_step: dict[str, Any], worker: Worker) -> Step:
    task = make_task(plan_step, title="Settle the plumber")
    run_until_idle(worker)
    blocked = task.steps.get()
    assert blocked.state == "blocked" and blocked.question_kind == "may_i"
    return blocked


def cli_fields(out: str) -> dict[str, str]:
    """The fields `manage.py task ID` printed for a call, read back: a short one beside its
    label, a block from the lines behind its bar."""
    fields: dict[str, str] = {}
    label = None
    for line in out.splitlines():
        if label and (bar := re.match(r"^ {15}\| ?(.*)$", line)):
            fields[label] += ("\n" if fields[label] else "") + bar.group(1)
            continue
        label = None
        if field := re.match(r"^ {13}([A-Z][\w ]*): (.*)$", line):
            if re.fullmatch(r"\([\d,]+ characters?(, [\d,]+ lines)?\)", field.group(2)):
                label, fields[field.group(1)] = field.group(1), ""
            else:
                fields[field.group(1)] = field.group(2)
    return fields


def view_texts(view: list[dict[str, str]]) -> dict[str, str]:
    return {f["label"]: f["text"] for f in view}


@pytest.mark.parametrize("plan_step", [EMAIL, POST, WRITE], ids=["email", "post", "file"])
def test_may_i_shows_the_whole_request_in_the_cli_the_api_and_the_page(
    plan_step: dict[str, Any], dad: User, worker: Worker, agent_client: Client, file_root: Path
) -> None:
    blocked = asked(plan_step, worker)
    expected = EXPECTED[plan_step["tool"]]

    out = io.StringIO()
    call_command("task", str(blocked.task_id), stdout=out)
    printed = cli_fields(out.getvalue())

    data = io.StringIO()
    call_command("task", str(blocked.task_id), "--json", stdout=data)
    cli_json = json.loads(data.getvalue())["steps"][0]["question"]

    response = agent_client.get(f"/api/tasks/{blocked.task_id}")
    assert response.status_code == 200
    api = response.json()["steps"][0]["question"]
    assert api == cli_json  # one shape, one home
    assert api["kind"] == "may_i" and api["effects"] == []
    assert api["call"]["tool"] == plan_step["tool"]
    shown = view_texts(api["call"]["request_view"])

    client = Client()
    client.force_login(dad)
    home = client.get(reverse("loop:home")).content.decode()
    task_page = client.get(reverse("loop:task", args=[blocked.task_id])).content.decode()

    for label, text in expected:
        if label == "JSON body":  # pretty-printed, in the order it is stored and sent (jsonb
            # keeps its own order on PostgreSQL)
            assert json.loads(shown[label]) == json.loads(text)
            assert shown[label] == json.dumps(json.loads(shown[label]), indent=2)
        else:
            assert shown[label] == text, label
        assert printed[label] == shown[label], label
        assert escape(shown[label]) in home, label
        assert escape(shown[label]) in task_page, label
    assert "<b>invoice</b>" not in home and "<b>invoice</b>" not in task_page  # escaped


def test_a_long_body_folds_on_the_page_a_short_one_does_not(dad: User, worker: Worker) -> None:
    blocked = asked(EMAIL, worker)
    client = Client()
    client.force_login(dad)
    home = client.get(reverse("loop:home")).content.decode()
    card = home[home.index(f'id="question-{blocked.pk}"') :]
    assert card.count('<details class="fold"') == 1  # the body; not the subject or recipients
    fold = card[card.index('<details class="fold"') : card.index("</details>")]
    assert "Show all 2,000 characters" in fold
    assert f'<pre class="full">{escape(BODY)}</pre>' in fold


def test_http_headers_are_shown_as_they_go_out_only_a_secret_by_its_name(db: None) -> None:
    """Nothing is hidden by a header name's shape (an attacker named the amount
    `X-Secret-Amount`); only a secret reference is not shown, by its name."""
    view = tools.get("http.post").request_view(
        {
            "url": "https://example.com/hook",
            "headers": {
                "Authorization": "Bearer ${secret:HOOK_TOKEN}",
                "X-Auth-Token": "abc123",
                "X-Secret-Amount": "1000000",
                "idempotency-key": "mine",
                "X-Request-Source": "pippa",
            },
            "json": [1, {"a": None}],
        }
    )
    texts = {f.label: f for f in view}
    headers = texts["Headers"].text.splitlines()
    assert "X-Request-Source: pippa" in headers
    assert "Content-Type: application/json" in headers  # what the tool adds for JSON
    assert "Authorization: Bearer [secret HOOK_TOKEN]" in headers
    assert "X-Auth-Token: abc123" in headers and "X-Secret-Amount: 1000000" in headers
    assert not any("mine" in h for h in headers)  # the Idempotency-Key is the tool's own
    assert texts["JSON body"] == Field("JSON body", json.dumps([1, {"a": None}], indent=2), "json")
    text_post = tools.get("http.put").request_view({"url": "http://h/x", "body": "a=1&b=2"})
    assert [(f.label, f.text) for f in text_post] == [
        ("Request", "PUT http://h/x"),
        ("Body", "a=1&b=2"),
    ]


def test_sql_shows_its_database_statement_and_parameters(
    db: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shop = dj_database_url.parse(f"sqlite:///{tmp_path / 'shop.sqlite3'}")
    monkeypatch.setitem(django_settings.DATABASES, "shop", shop)
    sql = "UPDATE orders\n   SET paid = %s\n WHERE id = %s"
    view = tools.get("sql.execute").request_view({"sql": sql, "params": [True, 7]})
    assert [(f.label, f.text) for f in view] == [
        ("Database", "shop"),
        ("SQL", sql),  # as written, its lines kept
        ("Parameters", json.dumps([True, 7], indent=2)),
    ]


def test_shell_shows_the_exact_argv_and_its_folder(db: None) -> None:
    argv = ["rsync", "-a", "my photos/", "backup:/srv/it's here"]
    view = tools.get("shell.run").request_view({"argv": argv, "cwd": "home", "timeout": 30})
    assert [(f.label, f.text) for f in view] == [
        ("Command", "rsync -a 'my photos/' 'backup:/srv/it'\"'\"'s here'"),
        ("Folder", "home (under the file root)"),
        ("Timeout", "30 seconds"),
    ]


def test_did_it_happen_shows_each_uncertain_effects_request_in_full(
    dad: User, agent_client: Client
) -> None:
    task = make_task(EMAIL, title="Settle the plumber")
    mail = task.steps.get()
    Effect.objects.create(
        id="e" * 64,
        task=task,
        step=mail,
        tool="email.send",
        target="plumber@example.com",
        summary="subject 'Your invoice'",
        request=EMAIL["args"],
        state="uncertain",
    )
    Step.objects.filter(pk=mail.pk).update(
        state="blocked",
        question_kind="did_it_happen",
        question_text="Did this happen?\nemail.send → plumber@example.com: subject 'Your invoice'",
    )
    Task.objects.filter(pk=task.pk).update(state="blocked")

    question = agent_client.get(f"/api/tasks/{task.pk}").json()["steps"][0]["question"]
    assert question["call"] is None
    assert view_texts(question["effects"][0]["request_view"])["Body"] == BODY

    out = io.StringIO()
    call_command("task", str(task.pk), stdout=out)
    assert cli_fields(out.getvalue())["Body"] == BODY

    client = Client()
    client.force_login(dad)
    home = client.get(reverse("loop:home")).content.decode()
    card = home[home.index(f'id="question-{mail.pk}"') :]
    assert "Did this happen?" in card and escape(BODY) in card
    assert "Not checked" in card


def test_the_cli_writes_a_hostile_bodys_terminal_escapes_out(dad: User, worker: Worker) -> None:
    hostile = {**EMAIL, "args": {**EMAIL["args"], "body": "hi\x1b[2J\x1b]0;owned\x07\nbye\r"}}
    blocked = asked(hostile, worker)
    out = io.StringIO()
    call_command("task", str(blocked.task_id), stdout=out)
    assert "\x1b" not in out.getvalue() and "\x07" not in out.getvalue()
    assert cli_fields(out.getvalue())["Body"] == "hi\\x1b[2J\\x1b]0;owned\\x07\nbye\\r"


def test_a_tool_without_a_view_and_args_a_view_cannot_read_show_every_argument(
    db: None,
) -> None:
    plain = tools.get("test.flaky").request_view({"fail_first": 2})
    assert plain == [Field("fail_first", "2", "json")]
    # A header object still a reference that was never filled in: shown as written, whole.
    args = {"url": "http://h/x", "headers": "${auth.headers}", "body": BODY}
    view = tools.get("http.post").request_view(args)
    assert [(f.label, f.text) for f in view] == [
        ("url", "http://h/x"),
        ("headers", "${auth.headers}"),
        ("body", BODY),
    ]
