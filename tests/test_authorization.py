"""An answer is for what Dad saw (DESIGN.md §5, §15 invariant 6): an authorization covers the
exact call its question showed. An edit of the call clears it and the guard asks again; the
call of a step with an effect beyond `pending` can't change; a start never consumes an
authorization for another call; an agent's `POST /api/effects` may send only its step's call."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from loop import actions, calls
from loop.api.core import issue
from loop.models import Effect, Event, Step, Task
from loop.permissions import SYSTEM
from loop.worker import Worker

from .conftest import make_task, run_until_idle, step
from .support.cuts import cut, next_worker, post, sent_not_recorded
from .support.sinks import Receiver
from .test_admin_plan_edits import admin_client, form_index, open_form
from .test_api import Agent


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as sink:
        yield sink


@pytest.fixture
def staff(db: None) -> Client:
    return admin_client(db)


def events(kind: str, step: Step) -> list[Event]:
    return list(Event.objects.filter(kind=kind, step=step).order_by("id"))


def paying(url: str, amount: int) -> dict[str, Any]:
    return {"url": url, "json": {"amount": amount}}


def admin_edit(client: Client, task: Task, pay: Step, **fields: str) -> str:
    """Change these fields of `pay` in the admin's task form, as a person would; the page
    the admin answers with."""
    form = open_form(client, task)
    index = form_index(form, pay)
    for name, value in fields.items():
        form[f"steps-{index}-{name}"] = value
    response = client.post(f"/admin/loop/task/{task.pk}/change/", form, follow=True)
    assert response.status_code == 200
    return response.content.decode()


def asking_may_i(worker: Worker, url: str) -> tuple[Task, Step]:
    task = make_task(post(url, confirm_before=True))
    run_until_idle(worker)
    pay = Step.objects.get(task=task)
    assert pay.question_kind == "may_i"
    return task, pay


def allowed(pay: Step, dad: User) -> Step:
    actions.unblock(step_id=pay.pk, decision="allow", actor="dad", user=dad)
    pay.refresh_from_db()
    assert pay.authorized_by == "dad"
    return pay


# ---- an edit of the call clears the authorization ----------------------------------------------


def test_allow_once_then_an_admin_edit_of_the_args_asks_again_and_sends_nothing(
    worker: Worker, receiver: Receiver, dad: User, staff: Client
) -> None:
    task, pay = asking_may_i(worker, receiver.url())
    assert '{"amount": 5}' in pay.question_text
    pay = allowed(pay, dad)
    assert pay.authorized_call == calls.digest("http.post", paying(receiver.url(), 5))

    page = admin_edit(staff, task, pay, args=json.dumps(paying(receiver.url(), 5000)))
    assert "Plan edited: &#x27;pay&#x27;" in page
    pay.refresh_from_db()
    assert (pay.state, pay.authorized_by, pay.authorized_call) == ("pending", "", "")
    [cleared] = events("authorization_cleared", pay)
    assert cleared.actor == "admin:staff"
    assert (
        cleared.data["by"] == "dad" and cleared.data["why"] == "its call was edited by admin:staff"
    )

    run_until_idle(worker)
    pay.refresh_from_db()
    assert pay.state == "blocked" and pay.question_kind == "may_i"
    assert '{"amount": 5000}' in pay.question_text  # the new call is what Dad is asked about
    assert receiver.posts == []
    assert events("authorization_consumed", pay) == []

    allowed(pay, dad)
    run_until_idle(worker)
    assert Step.objects.get(pk=pay.pk).state == "done"
    assert [p.json for p in receiver.posts] == [{"amount": 5000}]
    [consumed] = events("authorization_consumed", pay)
    assert consumed.data["call"] == calls.digest("http.post", paying(receiver.url(), 5000))


def test_an_edit_of_only_the_title_keeps_the_authorization(
    worker: Worker, receiver: Receiver, dad: User, staff: Client
) -> None:
    task, pay = asking_may_i(worker, receiver.url())
    allowed(pay, dad)
    admin_edit(staff, task, pay, title="pay the plumber", max_attempts="3")
    pay.refresh_from_db()
    assert (pay.title, pay.max_attempts, pay.authorized_by) == ("pay the plumber", 3, "dad")
    assert events("authorization_cleared", pay) == []

    run_until_idle(worker)
    assert Step.objects.get(pk=pay.pk).state == "done"
    assert [p.json for p in receiver.posts] == [{"amount": 5}]
    assert len(events("authorization_consumed", pay)) == 1


def test_an_edit_after_do_it_is_refused_naming_the_effect(receiver: Receiver, dad: User) -> None:
    """ "It did not — do it" settles the call a person was shown: it was sent once, and its
    effect is pending again to be sent as it was. Its call can't change any more (DESIGN.md
    §5): the edit is refused, naming the effect, and the call Dad answered for goes out."""
    receiver.behave("500")  # the POST may have happened
    task = make_task(post(receiver.url()))
    worker = next_worker()
    run_until_idle(worker)
    pay = Step.objects.get(task=task)
    assert pay.question_kind == "did_it_happen" and len(receiver.posts) == 1
    actions.unblock(step_id=pay.pk, decision="rerun", actor="dad", user=dad)
    [effect] = pay.effects.all()
    with pytest.raises(actions.Refused, match=f"effect {effect.pk[:8]}.*it was sent before"):
        actions.edit_steps(
            task_id=task.pk,
            edits={pay.pk: {"args": paying(receiver.url(), 7)}},
            actor="pippa",
            user=SYSTEM,
        )
    run_until_idle(worker)
    pay.refresh_from_db()
    assert pay.state == "done"
    assert [p.json for p in receiver.posts] == [post(receiver.url())["args"]["json"]] * 2


def test_a_start_never_consumes_an_authorization_for_another_call(
    worker: Worker, receiver: Receiver, dad: User
) -> None:
    """A door that changed the call without clearing the authorization (here, a raw UPDATE):
    the start sees the digest differ, clears it, journals why, and asks."""
    task, pay = asking_may_i(worker, receiver.url())
    allowed(pay, dad)
    Step.objects.filter(pk=pay.pk).update(args=paying(receiver.url(), 5000))
    run_until_idle(worker)
    pay.refresh_from_db()
    assert pay.state == "blocked" and pay.question_kind == "may_i"
    assert (pay.authorized_by, pay.authorized_call, pay.attempts) == ("", "", 0)
    [cleared] = events("authorization_cleared", pay)
    assert cleared.data["by"] == "dad"
    assert cleared.data["why"] == "the call about to run is not the one it was given for"
    assert receiver.posts == []
    assert events("authorization_consumed", pay) == []


# ---- a settled effect fixes the call ----------------------------------------------------------


def test_it_happened_then_an_edit_of_the_call_is_refused_naming_the_effect(
    receiver: Receiver, dad: User, staff: Client
) -> None:
    task = make_task(post(receiver.url()))
    cut(task, sent_not_recorded)
    worker = next_worker()
    run_until_idle(worker)
    pay = Step.objects.get(task=task)
    actions.unblock(step_id=pay.pk, decision="happened", actor="dad", user=dad)
    effect = Effect.objects.get(step=pay)
    assert effect.state == "succeeded"

    refused = (
        f"step 'pay': its call can't change: effect {effect.pk[:8]}… (http.post) is succeeded; "
        "a different request is a new step"
    )
    with pytest.raises(actions.Refused) as exc:
        actions.edit_steps(
            task_id=task.pk,
            edits={pay.pk: {"args": paying(receiver.url(), 5000)}},
            actor="x",
            user=SYSTEM,
        )
    assert str(exc.value) == refused
    with pytest.raises(actions.Refused):
        actions.edit_steps(
            task_id=task.pk, edits={pay.pk: {"tool": "http.put"}}, actor="x", user=SYSTEM
        )

    # The admin shows the call read-only, with the reason; a changed call in the POST is
    # ignored, a changed title saved, and the authorization kept.
    form = open_form(staff, task)
    index = form_index(form, pay)
    assert f"steps-{index}-args" not in form and f"steps-{index}-tool" not in form
    assert f"steps-{index}-title" in form
    page = staff.get(f"/admin/loop/task/{task.pk}/change/").content.decode()
    assert refused.replace("'", "&#x27;") in page
    form[f"steps-{index}-args"] = json.dumps(paying(receiver.url(), 5000))
    form[f"steps-{index}-title"] = "paid already"
    staff.post(f"/admin/loop/task/{task.pk}/change/", form)
    pay.refresh_from_db()
    assert pay.args == paying(receiver.url(), 5) and pay.title == "paid already"
    assert pay.authorized_by == "dad"

    run_until_idle(worker)
    assert Step.objects.get(pk=pay.pk).state == "done"  # from the receipt
    assert len(receiver.posts) == 1


# ---- the same through the API -----------------------------------------------------------------


@pytest.fixture
def pippa_agent(dad: User) -> Agent:
    _, token = issue(name="pippa", user=dad)
    return Agent(token)


def test_through_the_api_an_approval_then_an_edit_then_next_asks_again(
    pippa_agent: Agent, receiver: Receiver, staff: Client, dad: User
) -> None:
    """The agent's plan waits for Dad; his approval covers the call he saw; an edit after it
    clears it, and the agent's `next` gets a question, not the step."""
    made = pippa_agent.post(
        "/api/tasks",
        {"title": "pay", "steps": [post(receiver.url(), confirm_before=True)]},
    ).json()
    task = Task.objects.get(pk=made["id"])
    pay = Step.objects.get(task=task)
    assert made["waits_for_approval"]
    assert pippa_agent.post(f"/api/tasks/{task.pk}/next").status_code == 409  # paused
    actions.approve_plan(task_id=task.pk, actor="dad", user=dad)
    assert Step.objects.get(pk=pay.pk).authorized_by == "dad"

    admin_edit(staff, task, pay, args=json.dumps(paying(receiver.url(), 5000)))
    again = pippa_agent.post(f"/api/tasks/{task.pk}/next").json()
    assert again["step"] is None
    question = again["task"]["steps"][0]["question"]
    assert question["kind"] == "may_i" and '{"amount": 5000}' in question["text"]
    assert [e.actor for e in events("authorization_cleared", pay)] == ["admin:staff"]
    assert receiver.posts == []


def test_api_effects_sends_only_the_call_dad_allowed(
    pippa_agent: Agent, receiver: Receiver, file_root: Path, dad: User
) -> None:
    """Dad allowed a file.write; the agent holding the step tries an http.post and an
    email.send under it, and a write elsewhere: each is a 409 naming the difference,
    journaled, and nothing happens until it makes the call that was allowed."""
    write = {"path": "note.txt", "content": "hello"}
    task = make_task(step("w", "file.write", args=write, confirm_before=True), driver="pippa")
    w = Step.objects.get(task=task)
    assert pippa_agent.post(f"/api/tasks/{task.pk}/next").json()["step"] is None
    actions.unblock(step_id=w.pk, decision="allow", actor="dad", user=dad)
    taken = pippa_agent.post(f"/api/tasks/{task.pk}/next").json()
    assert taken["step"]["key"] == "w"
    held = {"lease_token": taken["lease_token"], "step": w.pk}

    other_tool = pippa_agent.post(
        "/api/effects", {**held, "tool": "http.post", "args": {"url": receiver.url()}}
    )
    assert other_tool.status_code == 409
    assert other_tool.json()["error"] == "tool: step 'w' calls file.write, not http.post"
    assert other_tool.json()["call"] == {"tool": "file.write", "args": write}
    mail = {"to": ["someone@example.com"], "subject": "hi", "body": "hi"}
    email = pippa_agent.post("/api/effects", {**held, "tool": "email.send", "args": mail})
    assert email.status_code == 409
    assert email.json()["error"] == "tool: step 'w' calls file.write, not email.send"
    elsewhere = {"path": "other.txt", "content": "hello"}
    other_args = pippa_agent.post("/api/effects", {**held, "tool": "file.write", "args": elsewhere})
    assert other_args.status_code == 409
    assert other_args.json()["error"] == "args: differ from the call of step 'w'"

    assert receiver.posts == [] and not Effect.objects.filter(step=w).exists()
    assert not (file_root / "other.txt").exists()
    refusals = events("call_refused", w)
    assert [e.data["tool"] for e in refusals] == ["http.post", "email.send", "file.write"]
    assert {e.actor for e in refusals} == {"agent:pippa"}

    done = pippa_agent.post("/api/effects", {**held, "tool": "file.write", "args": write})
    assert done.status_code == 200
    assert (file_root / "note.txt").read_text() == "hello"
