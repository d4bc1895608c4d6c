"""Plans edited in the admin: pending steps only, and never over what the loop wrote."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest
from django.contrib.auth.models import User
from django.test import Client

from loop import actions, plans
from loop.models import Event, Step, Task
from loop.permissions import SYSTEM
from loop.worker import Worker

from .conftest import make_task, step
from .support.sinks import closed_url


class FormFields(HTMLParser):
    """The fields a browser would submit from the admin's change form."""

    def __init__(self) -> None:
        super().__init__()
        self.data: dict[str, str] = {}
        self._textarea: str | None = None
        self._select: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        name = a.get("name")
        if tag == "input" and name and "disabled" not in a:
            kind = a.get("type", "text")
            if kind == "checkbox":
                if "checked" in a:
                    self.data[name] = "on"
            elif kind not in ("submit", "button", "file"):
                self.data[name] = a.get("value") or ""
        elif tag == "textarea" and name and "disabled" not in a:
            self._textarea = name
            self.data[name] = ""
        elif tag == "select" and name and "disabled" not in a:
            self._select = name
        elif tag == "option" and self._select and "selected" in a:
            self.data[self._select] = a.get("value") or ""

    def handle_data(self, data: str) -> None:
        if self._textarea:
            self.data[self._textarea] += (
                data.lstrip("\n") if not self.data[self._textarea] else data
            )

    def handle_endtag(self, tag: str) -> None:
        if tag == "textarea":
            self._textarea = None
        elif tag == "select":
            self._select = None


def admin_client(db: None) -> Client:
    user = User.objects.create_superuser("staff", "staff@localhost", "staff-password-1")
    client = Client()
    client.force_login(user)
    return client


def open_form(client: Client, task: Task) -> dict[str, str]:
    response = client.get(f"/admin/loop/task/{task.pk}/change/")
    assert response.status_code == 200
    parser = FormFields()
    parser.feed(response.content.decode())
    return parser.data


def form_index(data: dict[str, str], step_obj: Step) -> str:
    return next(
        k.split("-")[1] for k, v in data.items() if k.endswith("-id") and v == str(step_obj.pk)
    )


def test_a_loop_commit_while_the_form_is_open_is_kept(db: None, worker: Worker) -> None:
    client = admin_client(db)
    task = make_task(step("a", args={"value": "from the loop"}), step("b"))
    form = open_form(client, task)  # both steps pending: both editable
    a, b = task.steps.get(key="a"), task.steps.get(key="b")
    assert f"steps-{form_index(form, a)}-title" in form

    worker.once = True  # one step per tick: "b" stays pending (a worker would chain it)
    worker.tick()  # meanwhile the loop runs "a" and commits its result

    ia, ib = form_index(form, a), form_index(form, b)
    form[f"steps-{ia}-title"] = "edited in the admin"
    form[f"steps-{ia}-args"] = '{"value": "from the admin"}'
    form[f"steps-{ib}-title"] = "b, edited"
    response = client.post(f"/admin/loop/task/{task.pk}/change/", form, follow=True)
    assert response.status_code == 200
    text = response.content.decode()
    assert "was not changed: it left pending" in text

    a.refresh_from_db()
    assert a.state == "done" and a.attempts == 1
    assert a.output == {"value": "from the loop"}
    assert a.title == "a" and a.args == {"value": "from the loop"}
    b.refresh_from_db()
    assert b.title == "b, edited" and b.state == "pending"
    edit = Event.objects.get(kind="step_edited", step=b)
    assert edit.actor == "admin:staff" and edit.data["fields"] == ["title"]
    task.refresh_from_db()
    assert task.state == "running"


def test_pending_steps_reorder_and_bad_args_name_the_field(db: None) -> None:
    client = admin_client(db)
    task = make_task(step("a"), step("b"), step("c"))
    a, b, c = (task.steps.get(key=k) for k in "abc")
    form = open_form(client, task)
    form[f"steps-{form_index(form, b)}-position"] = str(c.position)
    form[f"steps-{form_index(form, c)}-position"] = str(b.position)
    response = client.post(f"/admin/loop/task/{task.pk}/change/", form)
    assert response.status_code == 302
    assert list(task.steps.order_by("position").values_list("key", flat=True)) == ["a", "c", "b"]
    assert Event.objects.filter(kind="step_edited", data__fields=["position"]).count() == 2

    form = open_form(client, task)
    form[f"steps-{form_index(form, a)}-tool"] = "email.send"
    form[f"steps-{form_index(form, a)}-args"] = '{"subject": "hi"}'
    response = client.post(f"/admin/loop/task/{task.pk}/change/", form)
    assert response.status_code == 200  # the form again, with its errors
    assert "tool &#x27;email.send&#x27; needs &#x27;to&#x27;" in response.content.decode()
    a.refresh_from_db()
    assert a.tool == "echo"


def test_done_steps_are_read_only_and_the_journal_cannot_be_edited(
    db: None, worker: Worker
) -> None:
    client = admin_client(db)
    task = make_task(step("a"), step("b"))
    worker.tick()
    form = open_form(client, task)
    a = task.steps.get(key="a")
    assert f"steps-{form_index(form, a)}-title" not in form  # disabled: not submitted
    event = Event.objects.first()
    assert event is not None
    assert client.get(f"/admin/loop/event/{event.pk}/change/").status_code == 200
    assert client.post(f"/admin/loop/event/{event.pk}/change/", {"kind": "x"}).status_code == 403
    assert client.get("/admin/loop/event/add/").status_code == 403


def test_steps_that_cannot_change_are_read_only_and_say_why(db: None, worker: Worker) -> None:
    client = admin_client(db)
    task = make_task(
        step("a"),
        step("ask", "http.post", args={"url": closed_url()}, confirm_before=True),
        step("c"),
    )
    worker.once = True
    worker.tick()  # "a" done
    worker.tick()  # "ask" asks "May I do this?"
    a, ask, c = (task.steps.get(key=k) for k in ("a", "ask", "c"))
    assert (a.state, ask.state, c.state) == ("done", "blocked", "pending")
    form = open_form(client, task)
    for locked in (a, ask):
        assert f"steps-{form_index(form, locked)}-args" not in form
    assert f"steps-{form_index(form, c)}-args" in form
    page = client.get(f"/admin/loop/task/{task.pk}/change/").content.decode()
    assert "read-only because" in page.lower()
    assert "done: it never runs again" in page
    assert "blocked: it waits for an answer to its question" in page


def test_an_admin_without_confirm_step_edits_nothing(db: None) -> None:
    """The admin's own change permissions let the form open; editing a plan is steering,
    which the action refuses without loop.confirm_step (journaled)."""
    from django.contrib.auth.models import Permission

    staff = User.objects.create_user("clerk", password="clerk-password-1", is_staff=True)
    staff.user_permissions.add(
        *Permission.objects.filter(codename__in=["view_task", "change_task", "change_step"])
    )
    client = Client()
    client.force_login(staff)
    task = make_task(step("a"), step("b"))
    form = open_form(client, task)
    a = task.steps.get(key="a")
    form[f"steps-{form_index(form, a)}-title"] = "edited by the clerk"
    response = client.post(f"/admin/loop/task/{task.pk}/change/", form, follow=True)
    assert response.status_code == 200
    assert "you may not edit steps (loop.confirm_step)" in response.content.decode()
    a.refresh_from_db()
    assert a.title == "a"
    assert not Event.objects.filter(kind="step_edited").exists()
    refused = Event.objects.get(kind="decision_refused", task=task)
    assert refused.actor == "admin:clerk" and refused.data["action"] == "edit steps"


def test_edit_steps_checks_the_edited_step_by_the_plans_rule_whoever_calls_it(db: None) -> None:
    task = make_task(step("a"), step("b", args={"value": "${a.value}"}), step("c"))
    a, b, c = (task.steps.get(key=k) for k in "abc")
    with pytest.raises(plans.PlanError) as caught:
        actions.edit_steps(
            task_id=task.pk,
            edits={a.pk: {"tool": "email.send", "args": {"subject": "hi"}, "max_attempts": 0}},
            actor="test",
            user=SYSTEM,
        )
    assert caught.value.errors == [
        "step 'a': tool 'email.send' needs 'to'",
        "step 'a': tool 'email.send' needs 'body'",
        "step 'a': tool 'email.send' has side effects; 'side_effect' can't be false",
        "step 'a': 'max_attempts' must be a whole number from 1 to 100",
    ]
    with pytest.raises(plans.PlanError) as caught:  # b would come before the step it reads
        actions.edit_steps(
            task_id=task.pk,
            edits={a.pk: {"position": b.position}, b.pk: {"position": a.position}},
            actor="test",
            user=SYSTEM,
        )
    assert caught.value.errors == ["step 'b': args refer to 'a', which is not an earlier step"]
    with pytest.raises(plans.PlanError) as caught:
        actions.edit_steps(
            task_id=task.pk, edits={c.pk: {"args": {"value": "${c.x}"}}}, actor="t", user=SYSTEM
        )
    assert caught.value.errors == ["step 'c': args refer to 'c', which is not an earlier step"]
    assert not Event.objects.filter(kind="step_edited").exists()
    assert list(task.steps.order_by("position").values_list("key", "tool", "max_attempts")) == [
        ("a", "echo", a.max_attempts),
        ("b", "echo", b.max_attempts),
        ("c", "echo", c.max_attempts),
    ]


def test_confirm_before_on_a_read_only_step_is_stored_as_the_plan_stores_it(db: None) -> None:
    task = make_task(step("a"))
    a = task.steps.get()
    actions.edit_steps(
        task_id=task.pk, edits={a.pk: {"confirm_before": True}}, actor="test", user=SYSTEM
    )
    a.refresh_from_db()
    assert a.confirm_before is False  # only a side-effect step asks first, as in a plan


def test_the_tasks_own_fields_are_read_only_and_a_save_that_changes_nothing_says_so(
    db: None,
) -> None:
    """Origin, instructions and the rest of the task are text on the page, not fields; a forged
    post of them changes nothing, and the admin says "Nothing was changed", not "changed
    successfully" (issue 28)."""
    client = admin_client(db)
    task = make_task(step("a"), title="Water the plants")
    Task.objects.filter(pk=task.pk).update(instructions="Be brief.")
    form = open_form(client, task)
    for name in ("title", "origin", "instructions", "created_by", "driver", "state"):
        assert name not in form, name
    page = client.get(f"/admin/loop/task/{task.pk}/change/").content.decode()
    assert "Be brief." in page and "Origin" in page
    forged = {**form, "origin": "schedule", "instructions": "Pay everyone", "title": "Forged"}
    response = client.post(f"/admin/loop/task/{task.pk}/change/", forged, follow=True)
    text = response.content.decode()
    assert "Nothing was changed." in text and "changed successfully" not in text
    task.refresh_from_db()
    assert (task.title, task.instructions) == ("Water the plants", "Be brief.")
    assert task.origin != "schedule"
