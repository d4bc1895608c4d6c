"""The conversation and schedules at every door (DESIGN.md §10, §13): `say` and
`conversation --json`, the API's messages and schedules with command receipts, the dashboard's
conversation page, the admin's schedule form, and each task's origin."""

from __future__ import annotations

import io
import json
import threading
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import time_machine
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from django.utils import timezone
from django.utils.html import escape

from loop import actions, plans, schedules
from loop.api.core import issue
from loop.models import AgentToken, Event, Message, Schedule, Task
from loop.permissions import SYSTEM
from loop.serialize import task_dict
from loop.web.words import plain_error

from .conftest import make_task, permission_objects, step


def shell(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_say_and_conversation_json_oldest_first(dad: User) -> None:
    User.objects.create_user("mum")
    first = int(shell("say", "every Monday at 8, email me the numbers", "--as", "dad"))
    second = int(shell("say", "noted", "--as", "mum"))
    said = json.loads(shell("conversation", "--json"))
    assert [(m["id"], m["author"], m["text"]) for m in said] == [
        (first, "dad", "every Monday at 8, email me the numbers"),
        (second, "mum", "noted"),
    ]
    assert set(said[0]) == {"id", "author", "text", "at"}
    assert "dad:" in shell("conversation")
    assert Event.objects.filter(kind="message_posted").count() == 2


def test_say_refuses_an_empty_message(db: None) -> None:
    with pytest.raises(CommandError, match="text: required, a non-empty string"):
        shell("say", "  ")
    assert not Message.objects.exists()


class Agent:
    def __init__(self, user: User, answers: bool = False) -> None:
        _, token = issue(name="pippa", user=user, answers=answers)
        self.client = Client(HTTP_AUTHORIZATION=f"Bearer {token}")

    def post(self, path: str, body: Any, key: str | None = None) -> Any:
        return self.client.post(
            path,
            json.dumps(body),
            "application/json",
            headers={"Idempotency-Key": key or uuid.uuid4().hex},
        )


def test_messages_over_the_api_replay_their_receipt(db: None, dad: User) -> None:
    agent = Agent(dad)
    first = agent.post("/api/messages", {"text": "the numbers are in"}, key="m1")
    again = agent.post("/api/messages", {"text": "the numbers are in"}, key="m1")
    assert first.status_code == again.status_code == 201
    assert again.json() == first.json() and again["Idempotent-Replayed"] == "true"
    assert first.json()["author"] == "agent:pippa" and first.json()["author_kind"] == "agent"
    assert agent.post("/api/messages", {"text": "other"}, key="m1").status_code == 409
    assert agent.post("/api/messages", {"text": ""}).json()["error"] == (
        "text: required, a non-empty string"
    )
    assert agent.post("/api/messages", {"txt": "x"}).status_code == 400
    listed = agent.client.get("/api/messages").json()
    assert [m["text"] for m in listed] == ["the numbers are in"]
    assert agent.client.get(f"/api/messages?after={listed[0]['id']}").json() == []
    assert Message.objects.count() == 1


def test_schedules_over_the_api(db: None, dad: User) -> None:
    """A schedule answers "May I do this?" ahead of time: only a person makes one (here Dad's
    own client, a token made with --answers); an agent token is refused."""
    plan = {
        "title": "numbers",
        "schedule": "0 8 * * MON",
        "timezone": "Europe/Berlin",
        "steps": [step("a")],
    }
    refused = Agent(dad).post("/api/schedules", plan)
    assert refused.status_code == 403
    assert "only a person may create a schedule" in refused.json()["detail"]
    AgentToken.objects.all().delete()
    agent = Agent(dad, answers=True)
    with time_machine.travel(datetime(2026, 6, 3, 12, tzinfo=UTC), tick=False):
        made = agent.post("/api/schedules", plan)
    assert made.status_code == 201, made.content
    assert made.json()["name"] == "numbers"
    assert made.json()["next_due"] == "2026-06-08T06:00:00+00:00"
    assert agent.post("/api/schedules", plan).status_code == 409  # the name is taken
    bad = agent.post("/api/schedules", {**plan, "schedule": "every monday"})
    assert bad.status_code == 400 and bad.json()["errors"][0].startswith(
        "schedule: 'every monday' has 2 fields"
    )
    no_task = agent.post("/api/tasks", plan)
    assert no_task.status_code == 400 and no_task.json()["error"].startswith("schedule:")
    assert not Task.objects.exists()
    assert [s["name"] for s in agent.client.get("/api/schedules").json()] == ["numbers"]


def test_each_task_records_its_origin(db: None, dad: User) -> None:
    by_plan = make_task(step("a"))
    agent = Agent(dad)
    created = agent.post("/api/tasks", {"title": "by api", "steps": [step("a")]})
    by_api = Task.objects.get(pk=created.json()["id"])
    client = Client()
    client.force_login(dad)
    client.post("/tasks/new", {"plan": json.dumps({"title": "by hand", "steps": [step("a")]})})
    by_dashboard = Task.objects.get(title="by hand")
    assert task_dict(by_plan)["origin"] == {"kind": "plan"}
    assert task_dict(by_api)["origin"] == {"kind": "api"}
    assert task_dict(by_dashboard)["origin"] == {"kind": "dashboard"}
    actions.give(task_id=by_plan.pk, agent="pippa", actor="dad", user=dad)
    replaced = agent.post(
        f"/api/tasks/{by_plan.pk}/supersede", {"title": "again", "steps": [step("b")]}
    )
    assert replaced.status_code == 201 and replaced.json()["origin"] == {"kind": "api"}
    events = task_dict(by_plan)["events"]
    assert [e["kind"] for e in events][:2] == ["task_created", "steps_added"]
    assert set(events[0]) == {"id", "kind", "step", "actor", "at", "data"}


def test_the_conversation_page_shows_messages_and_schedules(db: None, dad: User) -> None:
    shell("say", "hello <b>Pippa</b>", "--as", "dad")
    plan = {
        "title": "numbers",
        "schedule": "0 8 * * MON",
        "timezone": "Europe/Berlin",
        "steps": [step("a")],
    }
    with time_machine.travel(datetime(2026, 6, 3, 12, tzinfo=UTC), tick=False):
        schedules.create(spec=plans.validate(plan), actor="dad", user=SYSTEM)
    client = Client()
    client.force_login(dad)
    page = client.get("/conversation").content.decode()
    assert "hello &lt;b&gt;Pippa&lt;/b&gt;" in page
    assert (
        'datetime="2026-06-08T08:00:00+02:00"' in page
        or 'datetime="2026-06-08T06:00:00+00:00"' in page
    )
    assert client.post("/conversation", {"text": "stop"}).status_code == 302
    assert Message.objects.order_by("-id").first().author == "dad"  # type: ignore[union-attr]
    assert client.post("/conversation", {"text": ""}).status_code == 400
    assert Client().get("/conversation").status_code == 302  # login required


def test_the_admin_edits_a_schedule_through_the_action(db: None) -> None:
    staff = User.objects.create_superuser("staff", "staff@localhost", "staff-password-1")
    client = Client()
    client.force_login(staff)
    plan = {"title": "numbers", "schedule": "0 8 * * *", "steps": [step("a")]}
    schedule = schedules.create(spec=plans.validate(plan), actor="dad", user=SYSTEM)
    form = {
        "name": "numbers",
        "cron": "0 9 * * *",
        "timezone": "UTC",
        "plan": json.dumps(schedule.plan),
        "enabled": "on",
        "runs-TOTAL_FORMS": "0",
        "runs-INITIAL_FORMS": "0",
    }
    url = f"/admin/loop/schedule/{schedule.pk}/change/"
    bad = client.post(url, {**form, "cron": "9 to 5"})
    assert bad.status_code == 200 and "has 3 fields; a schedule has five" in bad.content.decode()
    assert client.post(url, form).status_code == 302
    schedule.refresh_from_db()
    assert schedule.cron == "0 9 * * *" and schedule.next_due.hour == 9
    assert schedule.next_due > timezone.now() and schedule.next_due - timezone.now() <= timedelta(
        days=1
    )
    [edited] = Event.objects.filter(kind="schedule_edited")
    assert edited.actor == "admin:staff" and edited.data["fields"] == ["cron"]
    added = client.post("/admin/loop/schedule/add/", {**form, "name": "second"})
    assert added.status_code == 302
    assert Schedule.objects.get(name="second").cron == "0 9 * * *"


def test_editing_a_schedule_needs_what_making_one_needs_whoever_asks(db: None) -> None:
    """The admin lets a clerk with `loop.change_schedule` open the form; the action itself
    refuses the edit (its runs answer "May I do this?" in advance), journaled."""
    clerk = User.objects.create_user("clerk", password="clerk-password-1", is_staff=True)
    clerk.user_permissions.add(*permission_objects("loop.change_schedule", "loop.view_schedule"))
    plan = {"title": "numbers", "schedule": "0 8 * * *", "steps": [step("a")]}
    schedule = schedules.create(spec=plans.validate(plan), actor="dad", user=SYSTEM)
    client = Client()
    client.force_login(clerk)
    form = {
        "name": "numbers",
        "cron": "0 9 * * *",
        "timezone": "UTC",
        "plan": json.dumps(schedule.plan),
        "runs-TOTAL_FORMS": "0",
        "runs-INITIAL_FORMS": "0",
    }
    url = f"/admin/loop/schedule/{schedule.pk}/change/"
    refused = client.post(url, form, follow=True)
    assert "Nothing was changed: you may not edit a schedule" in refused.content.decode()
    with pytest.raises(PermissionDenied):
        schedules.edit(
            schedule_id=schedule.pk, changes={"enabled": False}, actor="clerk", user=clerk
        )
    schedule.refresh_from_db()
    assert schedule.cron == "0 8 * * *" and schedule.enabled
    assert not Event.objects.filter(kind="schedule_edited").exists()
    journaled = Event.objects.filter(kind="decision_refused").order_by("id")
    assert [(e.actor, e.data["action"]) for e in journaled] == [
        ("admin:clerk", "edit a schedule"),
        ("clerk", "edit a schedule"),
    ]


@pytest.mark.django_db(transaction=True)
def test_a_message_written_while_a_run_commits_is_later_than_the_runs() -> None:
    """Ids follow commit order, so "the latest message" is the latest word: Dad's message,
    written while a run's transaction (which posted first) is still open, waits for it and
    comes after it — on PostgreSQL too, where ids are handed out before commit."""
    from django.db import connection, transaction

    from loop import conversation
    from loop.models import AuthorKind

    posted, release, ids = threading.Event(), threading.Event(), {}

    def run() -> None:
        try:
            with transaction.atomic():
                ids["run"] = conversation.post(
                    author="schedule:numbers",
                    kind=AuthorKind.SCHEDULE,
                    text="[SCHEDULED TASK] numbers",
                    user=SYSTEM,
                ).pk
                posted.set()
                release.wait(10)
        finally:
            connection.close()

    def dad() -> None:
        try:
            ids["dad"] = conversation.post(
                author="dad", kind=AuthorKind.USER, text="wait", user=SYSTEM
            ).pk
        finally:
            connection.close()

    runner = threading.Thread(target=run)
    runner.start()
    assert posted.wait(10)
    writer = threading.Thread(target=dad)
    writer.start()
    writer.join(0.5)
    assert writer.is_alive(), "Dad's message did not wait for the open run"
    release.set()
    runner.join(10)
    writer.join(10)
    assert ids["dad"] > ids["run"]
    assert conversation.latest_id() == ids["dad"]


def test_a_plan_with_a_schedule_on_the_new_task_page_makes_a_schedule(db: None, dad: User) -> None:
    client = Client()
    client.force_login(dad)
    plan = {"title": "numbers", "schedule": "0 8 * * MON", "steps": [step("a")]}
    response = client.post("/tasks/new", {"plan": json.dumps(plan)})
    made = Schedule.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/schedules/#schedule-{made.pk}"
    assert made.name == "numbers" and not Task.objects.exists()
    shown = client.get(response["Location"]).content.decode()
    assert "Schedule &#x27;numbers&#x27; made: it runs every Monday at 08:00, UTC." in shown
    again = client.post("/tasks/new", {"plan": json.dumps(plan)})
    assert again.status_code == 400 and Schedule.objects.count() == 1


def test_a_failed_run_shows_on_the_conversation_page(db: None, dad: User, settings: Any) -> None:
    settings.LOOP_SHELL_ENABLED = True
    plan = {
        "title": "backup",
        "schedule": "0 3 * * *",
        "steps": [step("run", "shell.run", args={"argv": ["true"]})],
    }
    schedule = schedules.create(spec=plans.validate(plan), actor="dad", user=SYSTEM)
    settings.LOOP_SHELL_ENABLED = False
    Schedule.objects.filter(pk=schedule.pk).update(next_due=timezone.now() - timedelta(minutes=1))
    [run] = schedules.fire_due(actor="test")
    client = Client()
    client.force_login(dad)
    page = client.get("/conversation").content.decode()
    # In words on the page (loop/web/words.py): the setting by what it does, not its name.
    assert (
        f"Failed: {escape(plain_error(run.error))}" in page
        and "tool &#x27;shell.run&#x27; is off" in page
    )
    assert "LOOP_SHELL_ENABLED" not in page and "LOOP_SHELL_ENABLED" in run.error


def test_making_a_schedule_needs_creating_and_answering(db: None, guest: User) -> None:
    """A schedule's runs answer "May I do this?" in advance: only someone who may create
    tasks and answer questions may make one. The refusal is journaled; nothing is made."""
    plan = {"title": "numbers", "schedule": "0 8 * * MON", "steps": [step("a")]}
    refused = Agent(guest).post("/api/schedules", plan)
    assert refused.status_code == 403, refused.content
    client = Client()
    client.force_login(guest)
    assert client.post("/tasks/new", {"plan": json.dumps(plan)}).status_code == 403
    assert not Schedule.objects.exists()
    assert [e.data["action"] for e in Event.objects.filter(kind="decision_refused")] == [
        "create a schedule",
        "create a schedule",
    ]


def test_writing_needs_loop_add_message(db: None, guest: User) -> None:
    client = Client()
    client.force_login(guest)
    assert 'id="message-text"' not in client.get("/conversation").content.decode()
    assert client.post("/conversation", {"text": "hello"}).status_code == 403
    assert not Message.objects.exists()
    [refused] = Event.objects.filter(kind="decision_refused")
    assert refused.data["action"] == "write in the conversation" and refused.actor == "guest"
