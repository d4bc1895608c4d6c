"""Each built-in tool's outcome classes and probes, against real sinks the tests start."""

from __future__ import annotations

import dataclasses
import smtplib
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dj_database_url
import pytest
from django.conf import settings as django_settings
from django.core.mail.backends.smtp import EmailBackend as SmtpBackend
from django.db import connection, transaction

from loop import journal, plans, tools
from loop.judges import Verdict, Work
from loop.judges import tool as tool_judge
from loop.models import Effect, Event, Step, Task
from loop.permissions import SYSTEM
from loop.tools.mail import message_id
from loop.worker import Worker

from .conftest import make_task, run_until_idle, step
from .support.cuts import claimed_not_sent, cut, next_worker, sent_not_recorded
from .support.sinks import Mailbox, Receiver, closed_url, smtp_server

pytestmark = pytest.mark.sqlite_only  # the tools' own checks: tried on the SQLite run


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as sink:
        yield sink


def only_step(task: Task) -> Step:
    return Step.objects.get(task=task)


def only_effect(task: Task) -> Effect:
    return Effect.objects.get(task=task)


def post(url: str, **fields: Any) -> dict[str, Any]:
    return step("hook", "http.post", args={"url": url, "json": {"order": 42}}, **fields)


# ---- HTTP ------------------------------------------------------------------------------------


def test_a_2xx_post_succeeds_and_carries_the_effect_id_as_idempotency_key(
    worker: Worker, receiver: Receiver
) -> None:
    task = make_task(post(receiver.url()))
    run_until_idle(worker)
    hook, effect = only_step(task), only_effect(task)
    assert hook.state == "done" and hook.output == {"status": 200, "body": {"received": 13}}
    assert effect.state == "succeeded" and effect.response == hook.output
    assert [(r.key, r.json) for r in receiver.posts] == [(effect.pk, {"order": 42})]


def test_deleting_a_task_takes_its_effects_and_every_event_naming_them(
    worker: Worker, receiver: Receiver
) -> None:
    # Event.effect has no database constraint (see the model): the step's cascade does it.
    task = make_task(post(receiver.url()))
    run_until_idle(worker)
    effect = only_effect(task)
    named = Event.objects.filter(effect=effect)
    assert {e.data.get("new") for e in named} >= {"pending", "running", "succeeded"}
    Task.objects.filter(pk=task.pk).delete()
    assert not Effect.objects.filter(pk=effect.pk).exists()
    assert not Event.objects.filter(effect_id=effect.pk).exists()


def test_the_journal_refuses_an_event_naming_an_effect_but_not_its_step(
    worker: Worker, receiver: Receiver
) -> None:
    task = make_task(post(receiver.url()))
    run_until_idle(worker)
    with transaction.atomic(), pytest.raises(ValueError, match="names its step"):
        journal.record("probe", task=task, effect=only_effect(task))


def test_a_plan_cannot_set_its_own_idempotency_key_header(
    worker: Worker, receiver: Receiver
) -> None:
    task = make_task(
        step(
            "hook",
            "http.put",
            args={"url": receiver.url(), "body": "x", "headers": {"idempotency-KEY": "mine"}},
        )
    )
    run_until_idle(worker)
    (put,) = receiver.posts
    assert put.method == "PUT" and put.key == only_effect(task).pk
    assert [k for k in put.headers if k.lower() == "idempotency-key"] == ["Idempotency-Key"]


def test_a_refused_connection_was_not_sent_and_the_step_retries(worker: Worker) -> None:
    task = make_task(post(closed_url()))
    assert worker.tick()
    hook, effect = only_step(task), only_effect(task)
    assert hook.state == "running" and hook.retry_at is not None and not hook.question_kind
    assert "not sent" in hook.error
    assert effect.state == "pending" and "refused" in effect.error.lower()


def test_a_4xx_is_rejected_and_the_step_fails(worker: Worker, receiver: Receiver) -> None:
    receiver.behave("400")
    task = make_task(post(receiver.url()))
    run_until_idle(worker)
    hook = only_step(task)
    assert hook.state == "failed" and "HTTP 400" in hook.error
    assert only_effect(task).state == "failed"
    assert len(receiver.posts) == 1


@pytest.mark.parametrize("status", ["408", "500"])
def test_a_408_or_5xx_is_uncertain_and_asks_did_this_happen(
    worker: Worker, receiver: Receiver, status: str
) -> None:
    receiver.behave(status)
    task = make_task(post(receiver.url()))
    run_until_idle(worker)
    hook, effect = only_step(task), only_effect(task)
    assert effect.state == "uncertain" and f"HTTP {status}" in effect.error
    assert hook.state == "blocked" and hook.question_kind == "did_it_happen"
    assert f"http.post → POST {receiver.url()}" in hook.question_text
    assert len(receiver.posts) == 1


def test_a_429_was_not_sent_and_retries_after_its_retry_after(
    worker: Worker, receiver: Receiver
) -> None:
    receiver.behave("429")
    task = make_task(post(receiver.url()))
    run_until_idle(worker)
    hook, effect = only_step(task), only_effect(task)
    assert hook.state == "running" and effect.state == "pending"
    retry = Event.objects.get(kind="step_retry", step=hook)
    assert hook.retry_at is not None
    assert round((hook.retry_at - retry.created_at).total_seconds()) == 7
    receiver.behave("ok")
    Task.objects.filter(pk=task.pk).update(run_after=None)  # the seven seconds have passed
    run_until_idle(worker)
    assert only_step(task).state == "done"
    assert [r.key for r in receiver.posts] == [effect.pk, effect.pk]


def test_a_timeout_after_the_request_was_written_is_uncertain(
    worker: Worker, receiver: Receiver, settings: Any
) -> None:
    settings.LOOP_HTTP_TIMEOUT = 0.5
    receiver.behave("hang")
    task = make_task(post(receiver.url()))
    run_until_idle(worker)
    effect = only_effect(task)
    assert effect.state == "uncertain" and "after the request was written" in effect.error
    assert only_step(task).question_kind == "did_it_happen"


def test_the_receivers_probe_settles_a_post_it_knows(
    worker: Worker, receiver: Receiver, settings: Any
) -> None:
    settings.LOOP_HTTP_TIMEOUT = 0.5
    settings.LOOP_HTTP_PROBE_URL = receiver.probe_url
    receiver.behave("hang")
    task = make_task(post(receiver.url()))
    run_until_idle(worker)
    effect = only_effect(task)
    assert only_step(task).state == "done"
    assert effect.state == "succeeded" and "the receiver knows key" in effect.evidence
    assert Event.objects.filter(kind="probe", effect=effect, data__found=True).exists()
    assert len(receiver.posts) == 1


def test_a_probe_that_finds_nothing_still_asks_and_shows_its_evidence(
    worker: Worker, receiver: Receiver, settings: Any
) -> None:
    settings.LOOP_HTTP_PROBE_URL = receiver.probe_url
    receiver.behave("500")
    task = make_task(post(receiver.url()))
    run_until_idle(worker)
    hook = only_step(task)
    assert hook.state == "blocked" and hook.question_kind == "did_it_happen"
    assert "[checked: the receiver does not know key" in hook.question_text


def test_a_read_only_step_may_not_call_a_side_effect_tool(
    worker: Worker, receiver: Receiver
) -> None:
    task = make_task(post(receiver.url()))
    Step.objects.filter(task=task).update(side_effect=False)  # e.g. a judge's own tool call
    hook = only_step(task)
    [verdict] = tool_judge.JUDGE.perform([Work(hook, worker.holding(task.lease_epoch))])
    assert isinstance(verdict, Verdict)
    assert verdict.kind == "failed"
    assert "is read-only, but tool 'http.post' has side effects: nothing was sent" in verdict.error
    assert receiver.posts == [] and not Effect.objects.exists()


# ---- files ------------------------------------------------------------------------------------


def test_file_write_writes_the_content_and_its_probe_knows_the_digest(
    worker: Worker, file_root: Path
) -> None:
    task = make_task(step("note", "file.write", args={"path": "a/b.txt", "content": "hi"}))
    run_until_idle(worker)
    effect = only_effect(task)
    assert (file_root / "a/b.txt").read_text() == "hi"
    assert only_step(task).output["sha256"] == effect.response["sha256"]
    probe = tools.get("file.write").probe
    assert probe is not None
    assert probe({"path": "a/b.txt", "content": "hi"}, effect.pk).found is True
    assert probe({"path": "a/b.txt", "content": "bye"}, effect.pk).found is False
    assert probe({"path": "nothing.txt", "content": "hi"}, effect.pk).found is False


def test_an_unexpected_failure_of_a_safe_to_repeat_write_retries_without_asking(
    worker: Worker, file_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = tools.get("file.write")

    def broken(args: dict[str, Any], effect_id: str) -> dict[str, Any]:
        raise RuntimeError("the disk controller hiccuped")

    monkeypatch.setitem(tools.base._registry, "file.write", dataclasses.replace(real, run=broken))
    task = make_task(step("note", "file.write", args={"path": "n.txt", "content": "x"}))
    assert worker.tick()
    note, effect = only_step(task), only_effect(task)
    assert note.state == "running" and note.retry_at is not None and not note.question_kind
    assert effect.state == "pending" and "hiccuped" in effect.error


@pytest.mark.parametrize(
    ("tool", "args"),
    [
        ("file.write", {"path": "../escaped.txt", "content": "x"}),
        ("file.read", {"path": "../escaped.txt"}),
        ("file.write", {"path": "sub/../../escaped.txt", "content": "x"}),
    ],
)
def test_paths_from_an_output_that_leave_the_file_root_are_refused_at_run_time(
    worker: Worker, file_root: Path, tool: str, args: dict[str, Any]
) -> None:
    """A path known in the plan is refused there (test_plan_time_checks); one that an earlier
    step's output fills in is refused when it is resolved."""
    (file_root.parent / "escaped.txt").write_text("outside")
    where = step("where", args={"value": args["path"]})
    task = make_task(where, step("escape", tool, args={**args, "path": "${where.value}"}))
    run_until_idle(worker)
    escape = Step.objects.get(task=task, key="escape")
    assert escape.state == "failed" and "outside the file root" in escape.error
    assert (file_root.parent / "escaped.txt").read_text() == "outside"


def test_file_write_onto_a_folder_is_rejected(worker: Worker, file_root: Path) -> None:
    (file_root / "folder").mkdir()
    task = make_task(step("note", "file.write", args={"path": "folder", "content": "x"}))
    run_until_idle(worker)
    assert only_step(task).state == "failed" and only_effect(task).state == "failed"


# ---- email --------------------------------------------------------------------------------------


@pytest.fixture
def mailbox(settings: Any) -> Iterator[Mailbox]:
    box = Mailbox()
    for host, port in smtp_server(box):
        settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
        settings.EMAIL_HOST, settings.EMAIL_PORT = host, port
        yield box


def mail(**args: Any) -> dict[str, Any]:
    return step(
        "mail", "email.send", args={"to": ["dad@example.com"], "subject": "Hi", "body": "B", **args}
    )


def test_email_goes_out_over_smtp_once_with_a_message_id_from_the_effect(
    worker: Worker, mailbox: Mailbox
) -> None:
    task = make_task(mail())
    run_until_idle(worker)
    effect = only_effect(task)
    assert only_step(task).output == {"message_id": message_id(effect.pk)}
    assert [m["Message-ID"] for m in mailbox.messages] == [message_id(effect.pk)]


def test_a_batch_performs_its_effects_at_once_and_records_each_outcome_on_its_own(
    worker: Worker, file_root: Path, receiver: Receiver, settings: Any
) -> None:
    settings.LOOP_HTTP_PROBE_URL = receiver.probe_url
    refused_url = closed_url()
    # Only one effect of a batch may be one whose cut would ask: the others settle themselves.
    settings.LOOP_IDEMPOTENT_RECEIVERS = [refused_url]
    receiver.behave("500")
    doubtful = make_task(step("hook", "http.post", args={"url": receiver.url(), "json": {}}))
    refused = make_task(step("gone", "http.post", args={"url": refused_url, "json": {}}))
    written = make_task(  # not a two-part tool: a thread of its own
        step("save", "file.write", args={"path": "a.txt", "content": "hi"})
    )
    assert worker.tick()
    # Every intent, then every claim, committed before anything was performed.
    states = [e.data["new"] for e in Event.objects.filter(kind="effect_state").order_by("id")]
    assert states[:6] == ["pending"] * 3 + ["running"] * 3
    assert only_step(doubtful).state == "blocked"  # the probe did not find it: Dad is asked
    assert only_step(doubtful).question_kind == "did_it_happen"
    assert only_effect(doubtful).state == "uncertain"
    assert only_step(refused).retry_at is not None and only_effect(refused).state == "pending"
    assert only_step(written).state == "done" and only_effect(written).state == "succeeded"
    assert [r.key for r in receiver.posts] == [only_effect(doubtful).pk]
    assert (file_root / "a.txt").read_text() == "hi"


def test_a_recipient_the_server_refuses_is_rejected(worker: Worker, mailbox: Mailbox) -> None:
    mailbox.refuse_rcpt = "550 no such user"
    task = make_task(mail())
    run_until_idle(worker)
    assert only_step(task).state == "failed" and only_effect(task).state == "failed"
    assert mailbox.messages == []


def test_a_recipient_the_server_defers_was_not_sent(worker: Worker, mailbox: Mailbox) -> None:
    mailbox.refuse_rcpt = "450 mailbox busy, try later"
    task = make_task(mail())
    assert worker.tick()
    assert only_step(task).retry_at is not None and only_effect(task).state == "pending"
    assert mailbox.messages == []


def test_a_refused_smtp_login_is_rejected_not_retried(
    worker: Worker, mailbox: Mailbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse_login(self: Any) -> None:
        raise smtplib.SMTPAuthenticationError(535, b"bad credentials")

    monkeypatch.setattr(SmtpBackend, "open", refuse_login)
    task = make_task(mail())
    run_until_idle(worker)
    assert only_step(task).state == "failed" and "refused our login" in only_step(task).error


def test_an_unreachable_mail_server_was_not_sent(worker: Worker, settings: Any) -> None:
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST = "127.0.0.1"
    settings.EMAIL_PORT = int(closed_url().split(":")[2].split("/")[0])
    task = make_task(mail())
    assert worker.tick()
    assert only_step(task).retry_at is not None and only_effect(task).state == "pending"


def test_the_mail_file_backend_probe_finds_a_sent_message(
    worker: Worker, settings: Any, tmp_path: Path
) -> None:
    settings.EMAIL_BACKEND = "django.core.mail.backends.filebased.EmailBackend"
    settings.EMAIL_FILE_PATH = str(tmp_path / "mail")
    task = make_task(mail())
    run_until_idle(worker)
    effect = only_effect(task)
    probe = tools.get("email.send").probe
    assert probe is not None
    found = probe(effect.request, effect.pk)
    assert found.found is True and found.response == {"message_id": message_id(effect.pk)}
    assert probe(effect.request, "0" * 64).found is False


# ---- SQL ----------------------------------------------------------------------------------------


@pytest.fixture
def shop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A real SQLite database beside the loop's, configured as the alias `shop`."""
    path = tmp_path / "shop.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT UNIQUE)")
    monkeypatch.setitem(
        django_settings.DATABASES, "shop", dj_database_url.parse(f"sqlite:///{path}")
    )
    return path


def rows(path: Path, sql: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(path) as db:
        return db.execute(sql).fetchall()


def insert(item: str, **args: Any) -> dict[str, Any]:
    return step(
        "order",
        "sql.execute",
        args={"sql": "INSERT INTO orders (item) VALUES (%s)", "params": [item], **args},
    )


def test_sql_execute_runs_once_and_records_its_effect_id_in_the_same_transaction(
    worker: Worker, shop: Path
) -> None:
    task = make_task(insert("tea"))  # no `database`: the first configured alias
    run_until_idle(worker)
    effect = only_effect(task)
    assert only_step(task).output == {"rowcount": 1}
    assert rows(shop, "SELECT item FROM orders") == [("tea",)]
    assert rows(shop, "SELECT effect_id, rowcount FROM pippa_effects") == [(effect.pk, 1)]


def test_a_repeat_of_a_committed_sql_effect_is_refused_by_the_primary_key(
    db: None, shop: Path
) -> None:
    sql = tools.get("sql.execute")
    args = {"database": "shop", "sql": "INSERT INTO orders (item) VALUES ('tea')"}
    assert sql.run(args, "e" * 64) == {"rowcount": 1}
    assert sql.run(args, "e" * 64) == {"rowcount": 1}  # answered from pippa_effects
    assert rows(shop, "SELECT count(*) FROM orders") == [(1,)]


def test_the_sql_probe_asks_the_effect_id_table(db: None, shop: Path) -> None:
    sql = tools.get("sql.execute")
    args = {"database": "shop", "sql": "INSERT INTO orders (item) VALUES ('tea')"}
    assert sql.probe is not None
    assert sql.probe(args, "a" * 64).found is False  # not even the table exists yet
    sql.run(args, "a" * 64)
    found = sql.probe(args, "a" * 64)
    assert found.found is True and found.response == {"rowcount": 1}
    missing = sql.probe(args, "b" * 64)
    assert missing.found is False and "did not commit" in missing.evidence


@pytest.mark.parametrize(
    ("statement", "why"),
    [
        ("INSERT INTO orders (item) VALUES ('dup')", "UNIQUE constraint failed"),
        ("INSERT INTO nowhere VALUES (1)", "no such table"),
    ],
)
def test_a_statement_the_database_refuses_is_rejected_and_rolled_back(
    worker: Worker, shop: Path, statement: str, why: str
) -> None:
    rows(shop, "INSERT INTO orders (item) VALUES ('dup')")
    task = make_task(step("bad", "sql.execute", args={"database": "shop", "sql": statement}))
    run_until_idle(worker)
    bad = only_step(task)
    assert bad.state == "failed" and why in bad.error
    assert rows(shop, "SELECT count(*) FROM pippa_effects") == [(0,)]


def test_a_database_that_cannot_be_reached_was_not_sent(
    worker: Worker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'no-such-folder' / 'x.sqlite3'}"
    monkeypatch.setitem(django_settings.DATABASES, "gone", dj_database_url.parse(url))
    task = make_task(step("w", "sql.execute", args={"database": "gone", "sql": "SELECT 1"}))
    assert worker.tick()
    assert only_step(task).retry_at is not None and only_effect(task).state == "pending"


def test_the_loops_own_database_is_off_limits(
    worker: Worker, monkeypatch: pytest.MonkeyPatch
) -> None:
    own = dict(django_settings.DATABASES["default"])
    monkeypatch.setitem(django_settings.DATABASES, "sneaky", own)
    # Named by an earlier output, the aliases pass the plan-time check and meet the run-time one.
    task = make_task(
        step("names", args={"value": {"own": "default", "other": "sneaky"}}),
        step(
            "a",
            "sql.execute",
            args={"database": "${names.value.own}", "sql": "DELETE FROM loop_event"},
        ),
        step(
            "b",
            "sql.execute",
            args={"database": "${names.value.other}", "sql": "DELETE FROM loop_event"},
        ),
    )
    run_until_idle(worker)
    a = Step.objects.get(task=task, key="a")
    assert a.state == "failed" and "off limits" in a.error
    from loop import actions

    actions.resume(task_id=task.pk, actor="dad", user=SYSTEM)
    run_until_idle(worker)
    b = Step.objects.get(task=task, key="b")
    assert b.state == "failed" and "the loop's own database under another name" in b.error
    assert Event.objects.exists()


def own_database_as(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    monkeypatch.setitem(django_settings.DATABASES, "sneaky", dj_database_url.parse(url))


def spellings_of_the_loops_file(tmp_path: Path) -> list[str]:
    """The loop's own SQLite file, under names that are not its URL's text (issue 24: the
    attacker's `var/./pippa.sqlite3` updated auth_user)."""
    own = Path(connection.settings_dict["NAME"])
    (tmp_path / "link").symlink_to(own)
    (tmp_path / "folder").symlink_to(own.parent, target_is_directory=True)
    hard = tmp_path / "hard.sqlite3"
    try:
        hard.hardlink_to(own)
    except OSError:  # another filesystem: no hard link to try
        hard = own
    return [
        f"sqlite:///{own.parent}/./{own.name}",
        f"sqlite:///{own.parent}/../{own.parent.name}/{own.name}",
        f"sqlite:///{tmp_path}/link",
        f"sqlite:///{tmp_path}/folder/{own.name}",
        f"sqlite:///{hard}",
    ]


@pytest.mark.skipif("connection.vendor != 'sqlite'")
def test_the_loops_own_sqlite_file_under_any_name_is_off_limits(
    db: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sql = {"database": "sneaky", "sql": "UPDATE auth_user SET password = 'x'"}
    for url in spellings_of_the_loops_file(tmp_path):
        own_database_as(monkeypatch, url)
        with pytest.raises(plans.PlanError, match="'sneaky' is the loop's own database under"):
            make_task(step("w", "sql.execute", args=sql))
        with pytest.raises(tools.ToolError, match="the loop's own database under another name"):
            tools.get("sql.execute").run(sql, "e" * 64)


def test_the_server_says_which_database_it_is_before_any_statement_runs(
    db: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the settings' look (a file made after the plan was checked, a pooler, a host name
    the check could not resolve), the connected database says what it is: the loop's own is
    refused before anything runs on it."""
    from loop.tools import sql as sql_tool

    if connection.vendor == "sqlite":
        (tmp_path / "link").symlink_to(connection.settings_dict["NAME"])
        own_database_as(monkeypatch, f"sqlite:///{tmp_path / 'link'}")
    else:
        config = connection.settings_dict
        own_database_as(
            monkeypatch,
            f"postgres://{config['USER']}@localhost:{config['PORT'] or 5432}/{config['NAME']}",
        )
    monkeypatch.setattr(sql_tool, "same_database", lambda a, b: False)
    before = Event.objects.count()
    statement = {"database": "sneaky", "sql": "DELETE FROM loop_event"}
    with pytest.raises(tools.ToolError, match=r"own database under another name \(the server says"):
        tools.get("sql.execute").run(statement, "e" * 64)
    assert Event.objects.count() == before


@pytest.mark.skipif("connection.vendor != 'postgresql'")
def test_the_loops_own_postgresql_database_by_another_host_name_is_off_limits(
    db: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = connection.settings_dict
    port = config["PORT"] or 5432
    for host in ("localhost", "127.0.0.1"):
        own_database_as(monkeypatch, f"postgres://{config['USER']}@{host}:{port}/{config['NAME']}")
        with pytest.raises(plans.PlanError, match="'sneaky' is the loop's own database under"):
            make_task(step("w", "sql.execute", args={"database": "sneaky", "sql": "SELECT 1"}))
    # Another database on the same server is not the loop's.
    own_database_as(monkeypatch, f"postgres://{config['USER']}@127.0.0.1:{port}/postgres")
    make_task(step("w", "sql.execute", args={"database": "sneaky", "sql": "SELECT 1"}))


def test_a_sqlite_target_can_attach_no_other_database(worker: Worker, shop: Path) -> None:
    own = connection.settings_dict["NAME"] if connection.vendor == "sqlite" else str(shop)
    task = make_task(
        step(
            "a", "sql.execute", args={"database": "shop", "sql": f"ATTACH DATABASE '{own}' AS own"}
        )
    )
    run_until_idle(worker)
    a = only_step(task)
    assert a.state == "failed" and "too many attached databases" in a.error


# ---- shell --------------------------------------------------------------------------------------


def test_shell_run_is_off_by_default_and_plans_using_it_are_refused(db: None) -> None:
    with pytest.raises(plans.PlanError, match="LOOP_SHELL_ENABLED"):
        make_task(step("sh", "shell.run", args={"argv": ["true"]}))


def test_shell_run_switched_off_after_planning_fails_at_run_time(
    worker: Worker, file_root: Path, settings: Any
) -> None:
    settings.LOOP_SHELL_ENABLED = True
    task = make_task(step("sh", "shell.run", args={"argv": ["touch", "ran"]}))
    settings.LOOP_SHELL_ENABLED = False
    run_until_idle(worker)
    assert only_step(task).state == "failed" and "is off" in only_step(task).error
    assert not (file_root / "ran").exists()


@pytest.fixture
def shell_on(settings: Any, file_root: Path) -> Path:
    settings.LOOP_SHELL_ENABLED = True
    return file_root


def test_a_nonzero_exit_is_a_result_not_an_error(worker: Worker, shell_on: Path) -> None:
    (shell_on / "work").mkdir()
    task = make_task(
        step(
            "sh",
            "shell.run",
            args={"argv": ["sh", "-c", "pwd; echo oops >&2; exit 3"], "cwd": "work"},
        )
    )
    run_until_idle(worker)
    sh = only_step(task)
    assert sh.state == "done"
    assert sh.output == {"returncode": 3, "stdout": "/files/work\n", "stderr": "oops\n"}


def test_shell_run_cwd_is_confined_to_the_file_root(worker: Worker, shell_on: Path) -> None:
    task = make_task(
        step("up", args={"value": "../"}),
        step("sh", "shell.run", args={"argv": ["true"], "cwd": "${up.value}"}),
    )
    run_until_idle(worker)
    sh = Step.objects.get(task=task, key="sh")
    assert sh.state == "failed" and "outside the file root" in sh.error


def test_a_program_that_does_not_exist_is_rejected(worker: Worker, shell_on: Path) -> None:
    task = make_task(step("sh", "shell.run", args={"argv": ["no-such-program-pippa"]}))
    run_until_idle(worker)
    assert only_step(task).state == "failed" and only_effect(task).state == "failed"


def test_a_command_killed_at_its_timeout_is_uncertain(worker: Worker, shell_on: Path) -> None:
    task = make_task(
        step(
            "sh",
            "shell.run",
            args={"argv": ["sh", "-c", "touch started; sleep 30"], "timeout": 1.5},
        )
    )
    run_until_idle(worker)
    assert (shell_on / "started").exists()
    assert only_effect(task).state == "uncertain"
    assert only_step(task).question_kind == "did_it_happen"


# ---- probes after a cut: the world answers before a person is asked -----------------------------


@pytest.mark.parametrize("partway", [sent_not_recorded, claimed_not_sent])
def test_a_cut_sql_effect_runs_again_and_its_table_answers_without_asking(
    db: None, shop: Path, partway: Any
) -> None:
    task = make_task(insert("tea"))
    cut(task, partway)
    run_until_idle(next_worker())
    order, effect = only_step(task), only_effect(task)
    assert order.state == "done" and order.output == {"rowcount": 1}
    # Safe to repeat: its target deduplicates by the effect id (pippa_effects).
    assert effect.safe_to_repeat and (effect.state, effect.sends) == ("succeeded", 2)
    assert not Event.objects.filter(kind="step_blocked").exists()  # nobody was asked
    assert rows(shop, "SELECT count(*) FROM orders") == [(1,)]
    assert rows(shop, "SELECT effect_id FROM pippa_effects") == [(effect.pk,)]


def test_a_cut_email_the_file_backend_holds_is_settled_by_its_probe(
    db: None, settings: Any, tmp_path: Path
) -> None:
    settings.EMAIL_BACKEND = "django.core.mail.backends.filebased.EmailBackend"
    settings.EMAIL_FILE_PATH = str(tmp_path / "mail")
    task = make_task(mail())
    cut(task, sent_not_recorded)
    run_until_idle(next_worker())
    assert only_step(task).state == "done" and only_effect(task).state == "succeeded"
    assert len(list((tmp_path / "mail").glob("*.log"))) == 1
