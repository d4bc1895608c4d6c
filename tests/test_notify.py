"""Dad is told (DESIGN.md §17, loop/notify): a real `runloop` follows the journal and sends a
burst of five questions as one email to a real SMTP server (aiosmtpd), one webhook POST to a
real receiver and one Web Push message to a push endpoint this test runs, which decrypts it
with the subscription's keys; then, an hour later by time-machine, a reminder."""

from __future__ import annotations

import base64
import email
import email.policy
import json
import os
import threading
import time
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import http_ece
import pytest
import time_machine
from aiosmtpd.controller import Controller
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from django.contrib.auth.models import User
from django.utils import timezone

from loop.models import NotifyCursor, PushSubscription, QuestionNotice, Worker
from loop.notify import channels
from loop.notify.notifier import Notifier

from .conftest import make_task, permission_objects, process_env, start_runloop, step, wait_for
from .support.chaos_sinks import free_port

pytestmark = [pytest.mark.django_db(transaction=True)]


class Mailbox:
    def __init__(self) -> None:
        self.messages: list[email.message.EmailMessage] = []
        self.rcpt: list[list[str]] = []
        outer = self

        class Handler:
            async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
                outer.rcpt.append(list(envelope.rcpt_tos))
                outer.messages.append(
                    email.message_from_bytes(envelope.original_content, policy=email.policy.default)  # type: ignore[arg-type]
                )
                return "250 OK"

        self.port = free_port()
        self.controller = Controller(Handler(), hostname="127.0.0.1", port=self.port)


class Receiver:
    """POSTs to /hook (JSON) and /push (Web Push: encrypted), kept with their headers."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, dict[str, str], bytes]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                size = int(self.headers.get("Content-Length", 0))
                outer.posts.append((self.path, dict(self.headers), self.rfile.read(size)))
                self.send_response(201)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def at(self, path: str) -> list[tuple[dict[str, str], bytes]]:
        return [(h, b) for p, h, b in self.posts if p == path]


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def test_a_burst_is_one_message_per_channel_then_a_reminder(
    processes: list[Any], settings: Any, tmp_path: Path, client: Any
) -> None:
    mailbox = Mailbox()
    mailbox.controller.start()
    receiver = Receiver()
    try:
        dad = User.objects.create_user("dad", email="dad@example.test", password="pw-dad-123456")
        dad.user_permissions.add(*permission_objects("loop.confirm_step"))
        User.objects.create_user("guest", email="guest@example.test")  # may not answer: no mail
        # The browser's side of a push subscription: its key pair and auth secret.
        browser = ec.generate_private_key(ec.SECP256R1())
        auth = os.urandom(16)
        public = browser.public_key().public_bytes(
            serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
        )
        client.force_login(dad)  # the browser sends its subscription, as notify.js does
        subscription = {
            "endpoint": receiver.url + "/push",
            "keys": {"p256dh": b64(public), "auth": b64(auth)},
        }
        answer = client.post(
            "/notify/push/subscribe", subscription, content_type="application/json"
        )
        assert answer.json() == {"subscribed": True}
        env = process_env(
            EMAIL_HOST="127.0.0.1",
            EMAIL_PORT=str(mailbox.port),
            SITE_URL="https://pippa.example.test",
            LOOP_NOTIFY_WEBHOOK_URL=receiver.url + "/hook",
            LOOP_NOTIFY_GATHER="1",
            LOOP_NOTIFY_EVERY="30",
            LOOP_NOTIFY_POLL="0.1",
        )
        # Two workers: one of them speaks (the oldest), so a message is sent once, not twice.
        for n in range(2):
            processes.append(start_runloop(env=env, log=tmp_path / f"worker{n}.log"))
        wait_for(lambda: Worker.objects.filter(state="running").count() == 2, timeout=60)
        wait_for(lambda: NotifyCursor.objects.filter(channel="push").exists(), timeout=60)
        tasks = [
            make_task(
                step(
                    "pay",
                    "file.write",
                    args={"path": f"bill-{n}.txt", "content": f"pay {n}"},
                    confirm_before=True,
                ),
                title=f"Pay bill {n}",
            )
            for n in range(5)
        ]
        asked = time.monotonic()
        wait_for(lambda: mailbox.messages and receiver.at("/hook") and receiver.at("/push"))
        print(f"\nfive questions -> one mail, webhook and push in {time.monotonic() - asked:.2f} s")
        wait_for(lambda: QuestionNotice.objects.count() == 5, timeout=10)
        time.sleep(1)  # a second message now would be a flood
        assert len(mailbox.messages) == 1, [m["Subject"] for m in mailbox.messages]
        mail = mailbox.messages[0]
        assert mailbox.rcpt == [["dad@example.test"]]
        assert mail["Subject"] == "Pippa Loop: 5 questions wait for you"
        text = mail.get_content()
        for task in tasks:
            step_id = task.steps.get().pk
            assert f"May I do this? {task.title}: pay" in text
            assert f"https://pippa.example.test/tasks/{task.pk}#step-{step_id}" in text
        assert "file.write → bill-3.txt" in text or "bill-3.txt" in text
        assert "pay 3" in text  # the call's fields, in full
        assert "Why you are asked: the first run of a step marked to ask before it runs" in text

        [(headers, hook)] = receiver.at("/hook")
        sent = json.loads(hook)
        assert sent["title"] == "5 questions wait for you"
        assert sorted(i["url"] for i in sent["items"]) == sorted(
            f"https://pippa.example.test/tasks/{t.pk}#step-{t.steps.get().pk}" for t in tasks
        )

        [(headers, pushed)] = receiver.at("/push")
        headers = {k.lower(): v for k, v in headers.items()}
        assert headers["content-encoding"] == "aes128gcm"
        vapid_key = channels.vapid_public_key()
        assert f"k={vapid_key}" in headers["authorization"]
        assert oct(channels.vapid_file().stat().st_mode & 0o777) == "0o600"
        plain = http_ece.decrypt(pushed, private_key=browser, auth_secret=auth, version="aes128gcm")
        message = json.loads(plain)
        assert message == {**sent}  # the same news as the webhook's
    finally:
        for proc in processes:
            proc.kill()
            proc.wait()
        processes.clear()

    try:
        # An hour later, still unanswered: one reminder of all five, by the rows the worker left.
        settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
        settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", mailbox.port
        settings.SITE_URL = "https://pippa.example.test"
        settings.LOOP_NOTIFY_WEBHOOK_URL = ""
        PushSubscription.objects.all().delete()
        notifier = Notifier()
        assert notifier.remind() == 0  # not yet
        with time_machine.travel(timezone.now() + timedelta(minutes=61)):
            assert notifier.remind() == 5
            assert notifier.remind() == 0  # once per LOOP_REMIND_AFTER
        assert len(mailbox.messages) == 2
        reminder = mailbox.messages[1]
        assert "Reminder — May I do this? Pay bill 0: pay" in reminder.get_content()
        assert "Asked: 1 h ago" in reminder.get_content()
        assert set(QuestionNotice.objects.values_list("reminded", flat=True)) == {1}
    finally:
        mailbox.controller.stop()
        receiver.server.shutdown()


def test_push_subscriptions_are_kept_per_browser_and_bad_input_names_the_field(
    dad: User, client: Any
) -> None:
    assert client.get("/notify/push/key").status_code == 302  # signed out: to the login
    client.force_login(dad)
    key = client.get("/notify/push/key").json()["key"]
    assert len(base64.urlsafe_b64decode(key + "=")) == 65
    good = {
        "endpoint": "https://push.example.test/abc",
        "keys": {"p256dh": key, "auth": b64(b"\1" * 16)},
    }
    for body, field in [
        ("nope", "body"),
        ({**good, "endpoint": "ftp://x"}, "endpoint"),
        ({**good, "keys": {"p256dh": "AAAA", "auth": good["keys"]["auth"]}}, "keys.p256dh"),  # type: ignore[index]
        ({**good, "keys": {"p256dh": key}}, "keys.auth"),
    ]:
        answer = client.post("/notify/push/subscribe", body, content_type="application/json")
        assert (answer.status_code, answer.json()["field"]) == (400, field)
    assert not PushSubscription.objects.exists()  # nothing half-made
    for _ in range(2):  # the same browser again: one row
        answer = client.post("/notify/push/subscribe", good, content_type="application/json")
        assert answer.json() == {"subscribed": True}
    assert PushSubscription.objects.get().user == dad
    client.post(
        "/notify/push/subscribe",
        {"endpoint": good["endpoint"], "remove": True},
        content_type="application/json",
    )
    assert not PushSubscription.objects.exists()
    worker = client.get("/sw.js")
    assert worker["Service-Worker-Allowed"] == "/" and b"showNotification" in worker.content


def test_push_subscribe_needs_csrf(dad: User) -> None:
    from django.test import Client

    strict = Client(enforce_csrf_checks=True)
    strict.force_login(dad)
    answer = strict.post("/notify/push/subscribe", {}, content_type="application/json")
    assert answer.status_code == 403


def test_the_banner_names_the_remedy_and_a_dead_workers_hold_is_not_shown(
    dad: User, client: Any
) -> None:
    from loop import lease
    from loop.models import Task, WorkerState

    client.force_login(dad)
    page = client.get("/").content.decode()
    assert "no worker is alive" in page
    assert "The loop is stopped: nothing runs and no answer is acted on. Run bin/up again" in page
    task = make_task(step("a"), title="Held")
    gone = Worker.objects.create(
        label="gone", pid=1, host="h", state=WorkerState.DEAD, last_seen=timezone.now()
    )
    Task.objects.filter(pk=task.pk).update(
        lease_owner=gone.pk, lease_until=timezone.now() + timedelta(minutes=5)
    )
    task.refresh_from_db()
    assert lease.holder(task) is not None  # the lease itself runs on
    assert lease.holder(task, shown=True) is None
    assert "held by" not in client.get(f"/tasks/{task.pk}").content.decode()


def test_the_news_of_a_failed_task_a_dead_worker_and_a_model_endpoint_down(
    worker: Any, settings: Any
) -> None:
    from django.db import transaction

    from loop import journal
    from loop.models import Event, EventKind, Task, WorkerState
    from loop.notify import news

    from .conftest import run_until_idle

    settings.SITE_URL = "https://p.test"
    task = make_task(
        step("x", "test.flaky", args={"fail_first": 5}, max_attempts=1), title="Doomed"
    )
    run_until_idle(worker)
    assert Task.objects.get(pk=task.pk).state == "failed"
    gone = Worker.objects.create(label="gone", pid=1, host="h", state=WorkerState.DEAD)
    with transaction.atomic():
        journal.record(EventKind.WORKER_DEAD, actor="test", worker=gone.pk)
        journal.record(EventKind.WORKER_PARKED, actor="worker:9", reason="low disk: 3 MB free")
        for _ in range(3):  # a flood of retries is one piece of news
            journal.record(EventKind.MODEL_RETRY, actor="test", reason="connection refused")
    found = news.of_events(Event.objects.order_by("id"))
    told = {
        n.key.removeprefix("parked-") if n.key.startswith("parked") else n.kind: n for n in found
    }
    parked = told.pop("worker:9")
    assert parked.title == "A worker stopped taking new work: low disk: 3 MB free"
    assert parked.lines == ["Free disk space in the data folder; the worker goes on by itself."]
    assert sorted(told) == ["failed", "model", "worker"]
    assert told["failed"].title == "Task failed: Doomed"
    assert told["failed"].url == f"https://p.test/tasks/{task.pk}"
    assert "attempt 1 of x failed on purpose" in told["failed"].lines[0]
    assert told["worker"].title == f"{gone} stopped answering and was found dead"
    assert "run bin/up again" in told["worker"].lines[0]
    assert told["model"].lines == ["3 call(s) retried; the last said: connection refused"]


@pytest.mark.sqlite_only
@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"question_kind": "did_it_happen"}, "a crash: a try was cut off"),
        ({"judge": "model"}, "Pippa chose this call while doing the step"),
        ({"writer": "pippa"}, "Pippa wrote this step"),
        ({"writer": "agent", "written_by": "kidbot"}, "an agent (kidbot) wrote this step"),
        ({"writer": "schedule"}, "a scheduled run: you wrote to Pippa since it began"),
        ({"attempts": 1}, "the first run of a step marked to ask before it runs"),
        ({"attempts": 2}, "a step marked to ask before each run"),
    ],
)
def test_why_a_question_is_asked(fields: dict[str, Any], said: str) -> None:
    from loop.models import Step
    from loop.notify import news

    step = Step(**{"question_kind": "may_i", "writer": "person", **fields})
    assert news.why(step).startswith(said)


@pytest.mark.sqlite_only
def test_ages_read_as_dad_says_them() -> None:
    from loop.notify.news import ago

    now = timezone.now()
    said = [ago(now - timedelta(seconds=s), now) for s in (5, 12 * 60, 3 * 3600, 3 * 86400)]
    assert said == ["just now", "12 min ago", "3 h ago", "3 days ago"]


def test_a_failed_send_is_sent_again_and_the_cursor_moves_only_then(
    worker: Any, settings: Any, monkeypatch: Any
) -> None:
    from loop.models import Event
    from loop.notify import notifier as following

    monkeypatch.setattr(following, "SETTLE_PG", 0.0)  # no waiting for late commits here
    settings.LOOP_NOTIFY_GATHER = 0
    settings.LOOP_NOTIFY_EVERY = 0

    class Flaky:
        name = "flaky"
        down = True
        sent: list[list[str]] = []

        def enabled(self) -> bool:
            return True

        def send(self, found: Any) -> None:
            if self.down:
                raise channels.NotSent("flaky: down")
            self.sent.append([n.title for n in found])

    channel = Flaky()
    notifier = Notifier([channel])
    assert notifier.pass_once() == {"flaky": 0, "reminders": 0}  # a fresh cursor: at the top
    start = NotifyCursor.objects.get(channel="flaky").last_event
    make_task(step("pay", "file.write", args={"path": "p", "content": "x"}, confirm_before=True))
    worker.tick()
    notifier.pass_once()
    assert NotifyCursor.objects.get(channel="flaky").last_event == start  # not delivered
    assert notifier.retry_at["flaky"] > 0  # backing off
    channel.down = False
    notifier.retry_at.clear()
    assert notifier.pass_once()["flaky"] == 1
    assert channel.sent == [["May I do this? test task: pay"]]
    top = Event.objects.order_by("-id").values_list("id", flat=True).first()
    assert NotifyCursor.objects.get(channel="flaky").last_event == top
    assert Notifier([channel]).pass_once()["flaky"] == 0  # a restart: told already
    assert channel.sent == [["May I do this? test task: pay"]]
