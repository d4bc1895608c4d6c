"""What Dad sees and may do on the dashboard pages (Django test client)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from loop.models import Event, Step, Task
from loop.worker import Worker

from .conftest import make_task, run_until_idle, step


def logged_in(user: User, **kwargs: object) -> Client:
    client = Client(**kwargs)  # type: ignore[arg-type]
    client.force_login(user)
    return client


def ask_first(key: str = "pay") -> dict[str, object]:
    return step(
        key,
        "http.post",
        args={"url": "http://127.0.0.1:9/pay", "json": {"n": 1}},
        confirm_before=True,
    )


def test_every_page_needs_a_login(db: None) -> None:
    task = make_task(step("a"))
    for url in (
        reverse("loop:home"),
        reverse("loop:task", args=[task.pk]),
        reverse("loop:new_task"),
    ):
        response = Client().get(url)
        assert response.status_code == 302
        assert response["Location"].startswith("/accounts/login/")
    assert Client().get("/accounts/login/").status_code == 200


def test_home_shows_the_question_first_with_its_buttons(dad: User, worker: Worker) -> None:
    task = make_task(step("look"), ask_first(), title="Pay the plumber")
    run_until_idle(worker)
    page = logged_in(dad).get(reverse("loop:home")).content.decode()
    assert page.index('id="needs-you"') < page.index('id="running"') < page.index('id="recent"')
    assert "May I do this?" in page and "POST http://127.0.0.1:9/pay" in page
    assert "Allow once" in page and "Deny" in page
    assert "<title>(1) Pippa Loop</title>" in page
    assert f'id="task-row-{task.pk}"' in page and "1 of 2 steps done" in page


def test_a_reader_sees_no_buttons_and_a_forged_post_is_refused_and_journaled(
    guest: User, worker: Worker
) -> None:
    make_task(ask_first())
    run_until_idle(worker)
    blocked = Step.objects.get(key="pay")
    client = logged_in(guest)
    page = client.get(reverse("loop:home")).content.decode()
    assert "May I do this?" in page and "Allow once" not in page
    response = client.post(reverse("loop:decide", args=[blocked.pk]), {"decision": "allow"})
    assert response.status_code == 403
    blocked.refresh_from_db()
    assert blocked.state == "blocked"
    refused = Event.objects.filter(kind="decision_refused", step=blocked).get()
    assert refused.actor == "guest"
    response = client.post(reverse("loop:pause", args=[blocked.task_id]))
    assert response.status_code == 403
    assert Event.objects.filter(kind="decision_refused", data__action="pause").exists()


def test_a_post_without_the_csrf_token_is_refused(dad: User, worker: Worker) -> None:
    make_task(ask_first())
    run_until_idle(worker)
    blocked = Step.objects.get(key="pay")
    client = logged_in(dad, enforce_csrf_checks=True)
    response = client.post(reverse("loop:decide", args=[blocked.pk]), {"decision": "allow"})
    assert response.status_code == 403
    blocked.refresh_from_db()
    assert blocked.state == "blocked"


@pytest.mark.parametrize("name", ["decide", "pause", "resume", "add_steps", "supersede"])
def test_get_on_a_post_endpoint_is_405(dad: User, name: str) -> None:
    task = make_task(step("a"))
    arg = task.steps.get().pk if name == "decide" else task.pk
    assert logged_in(dad).get(reverse(f"loop:{name}", args=[arg])).status_code == 405


def test_allow_once_by_htmx_answers_with_a_fragment(dad: User, worker: Worker) -> None:
    make_task(ask_first())
    run_until_idle(worker)
    blocked = Step.objects.get(key="pay")
    response = logged_in(dad).post(
        reverse("loop:decide", args=[blocked.pk]), {"decision": "allow"}, HTTP_HX_REQUEST="true"
    )
    assert response.status_code == 200 and b"Allowed once" in response.content
    assert b"<html" not in response.content
    blocked.refresh_from_db()
    assert blocked.state == "pending" and blocked.authorized_by == "dad"


@pytest.mark.parametrize(
    ("amount", "said", "args"),
    [
        ("1", "as it was (your edit changed nothing)", {"n": 1}),
        ("2", "as you edited it", {"n": 2}),
    ],
)
def test_edit_then_allow_says_whether_the_call_changed(
    dad: User, worker: Worker, amount: str, said: str, args: dict[str, int]
) -> None:
    """The answer tells Dad what the journal holds: an edit the form sent back unchanged (a
    field he did not touch, or one a reload reset) is not called an edit."""
    make_task(ask_first())
    run_until_idle(worker)
    blocked = Step.objects.get(key="pay")
    form = {"decision": "allow", "edit": "1", "arg.url": "http://127.0.0.1:9/pay"}
    response = logged_in(dad).post(
        reverse("loop:decide", args=[blocked.pk]),
        {**form, "arg.json": f'{{"n": {amount}}}'},
        HTTP_HX_REQUEST="true",
    )
    assert response.status_code == 200 and said.encode() in response.content
    blocked.refresh_from_db()
    assert blocked.state == "pending" and blocked.args["json"] == args


def test_a_decision_that_does_not_answer_the_question_is_409_and_named(
    dad: User, worker: Worker
) -> None:
    make_task(ask_first())
    run_until_idle(worker)
    blocked = Step.objects.get(key="pay")
    client = logged_in(dad)
    response = client.post(reverse("loop:decide", args=[blocked.pk]), {"decision": "happened"})
    assert response.status_code == 409 and b"decision:" in response.content
    response = client.post(reverse("loop:decide", args=[blocked.pk]), {"decision": "maybe"})
    assert response.status_code == 400 and b"decision:" in response.content


def test_new_task_from_a_pasted_plan_and_errors_beside_the_field(dad: User) -> None:
    client = logged_in(dad)
    bad = "title: T\nsteps:\n  - {key: mail, tool: email.send, args: {subject: hi, body: x}}\n"
    response = client.post(reverse("loop:new_task"), {"plan": bad})
    assert response.status_code == 400
    assert (
        b"step &#x27;mail&#x27;: tool &#x27;email.send&#x27; needs &#x27;to&#x27;"
        in response.content
    )
    assert Task.objects.count() == 0
    good = '{"title": "From JSON", "steps": [{"key": "a", "tool": "echo", "args": {"value": 1}}]}'
    response = client.post(reverse("loop:new_task"), {"plan": good})
    task = Task.objects.get()
    assert response.status_code == 302 and response["Location"] == reverse(
        "loop:task", args=[task.pk]
    )


def test_new_task_from_an_uploaded_file(dad: User) -> None:
    from django.core.files.uploadedfile import SimpleUploadedFile

    plan = SimpleUploadedFile(
        "plan.yaml", b"title: Uploaded\nsteps:\n  - {key: a, tool: echo, args: {value: 1}}\n"
    )
    response = logged_in(dad).post(reverse("loop:new_task"), {"plan": "", "file": plan})
    assert response.status_code == 302 and Task.objects.get().title == "Uploaded"


def test_task_page_shows_steps_output_escaped_journal_and_timeline(
    dad: User, worker: Worker
) -> None:
    task = make_task(step("xss", args={"value": "<script>alert(1)</script>"}), step("b"))
    run_until_idle(worker)
    page = logged_in(dad).get(reverse("loop:task", args=[task.pk])).content.decode()
    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert f'id="step-{task.steps.get(key="b").pk}"' in page
    assert "<svg" in page and 'class="tl-done"' in page
    assert "step_done" in page and 'id="journal-rows"' in page


def test_add_steps_after_a_step_and_errors_name_the_field(dad: User) -> None:
    task = make_task(step("a"), step("c"))
    client = logged_in(dad)
    url = reverse("loop:add_steps", args=[task.pk])
    response = client.post(url, {"after": "a", "steps": "- {key: b, tool: nope}"})
    assert response.status_code == 400 and b"unknown tool" in response.content
    assert task.steps.count() == 2
    response = client.post(url, {"after": "a", "steps": "- {key: b, tool: echo, args: {value: 2}}"})
    assert response.status_code == 302
    assert list(task.steps.order_by("position").values_list("key", flat=True)) == ["a", "b", "c"]


def test_pause_resume_and_supersede(dad: User) -> None:
    task = make_task(step("a"), step("b"))
    client = logged_in(dad)
    assert client.post(reverse("loop:pause", args=[task.pk])).status_code == 302
    task.refresh_from_db()
    assert task.state == "paused"
    assert client.post(reverse("loop:pause", args=[task.pk])).status_code == 409
    assert client.post(reverse("loop:resume", args=[task.pk])).status_code == 302
    plan = "title: Better\nsteps:\n  - {key: z, tool: echo, args: {value: 1}}\n"
    response = client.post(reverse("loop:supersede", args=[task.pk]), {"plan": plan})
    task.refresh_from_db()
    assert task.state == "superseded" and task.successor is not None
    assert response["Location"] == reverse("loop:task", args=[task.successor.pk])


def test_the_dashboard_asks_the_same_permissions_as_the_api(dad: User, worker: Worker) -> None:
    """Answering and steering need loop.confirm_step, a new task loop.add_task: the action
    checks, whichever page posts."""
    from django.contrib.auth.models import Permission

    from .conftest import permission_objects

    answers_only = User.objects.create_user("mum")
    answers_only.user_permissions.add(*permission_objects("loop.confirm_step"))
    client = logged_in(answers_only)
    assert b"New task</a>" not in client.get(reverse("loop:home")).content
    good = '{"title": "T", "steps": [{"key": "a", "tool": "echo", "args": {"value": 1}}]}'
    response = client.post(reverse("loop:new_task"), {"plan": good})
    assert response.status_code == 403 and b"loop.add_task" in response.content
    assert Task.objects.count() == 0
    refused = Event.objects.get(kind="decision_refused", data__action="create a task")
    assert refused.actor == "mum" and refused.data["reason"] == "missing permission loop.add_task"

    task = make_task(step("a"), step("b"))
    creates_only = User.objects.create_user("visitor")
    creates_only.user_permissions.add(Permission.objects.get(codename="add_task"))
    client = logged_in(creates_only)
    assert b"New task</a>" in client.get(reverse("loop:home")).content
    more = "- {key: c, tool: echo, args: {value: 3}}"
    response = client.post(reverse("loop:add_steps", args=[task.pk]), {"steps": more})
    assert response.status_code == 403 and b"you may not add steps" in response.content
    response = client.post(
        reverse("loop:supersede", args=[task.pk]), {"plan": good.replace('"T"', '"v2"')}
    )
    assert response.status_code == 403 and b"loop.confirm_step" in response.content
    task.refresh_from_db()
    assert task.state == "running" and Task.objects.count() == 1
    assert task.steps.count() == 2


def test_a_task_that_ended_offers_no_add_steps_or_supersede(dad: User, worker: Worker) -> None:
    """Both would be refused (the task takes no more steps and no successor)."""
    client = logged_in(dad)
    finished = make_task(step("a"))
    run_until_idle(worker)
    assert Task.objects.get(pk=finished.pk).state == "done"
    open_one = make_task(step("b"), title="not run yet")
    done_page = client.get(reverse("loop:task", args=[finished.pk])).content.decode()
    assert reverse("loop:add_steps", args=[finished.pk]) not in done_page
    assert reverse("loop:supersede", args=[finished.pk]) not in done_page
    open_page = client.get(reverse("loop:task", args=[open_one.pk])).content.decode()
    assert reverse("loop:add_steps", args=[open_one.pk]) in open_page
    assert reverse("loop:supersede", args=[open_one.pk]) in open_page
