"""What a tool can check without acting is checked when the plan is made (issue 12 item 8): a
plan that could only fail after Dad said "yes" is refused before it asks him, naming the step and
the field. A field filled from an earlier step's output (`${...}`) is checked once resolved."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from loop import plans
from loop.api.core import issue
from loop.models import Step, Task

from .conftest import make_task, step

URL = "http://127.0.0.1:9/hook"
MAIL = {"subject": "hi", "body": "x"}

# (tool, args, the one refusal). Each would have asked "May I do this?" and failed after.
REFUSED: list[tuple[str, dict[str, Any], str]] = [
    ("http.post", {"url": URL, "headers": {"Content-Length": "9"}}, "args.headers: header 'Content-Length' is set by the tool"),
    ("http.put", {"url": URL, "headers": {"transfer-encoding": "chunked"}}, "args.headers: header 'transfer-encoding' is set by the tool"),
    ("http.get", {"url": URL, "headers": {"Connection": "keep-alive"}}, "args.headers: header 'Connection' is set by the tool"),
    ("http.post", {"url": URL, "headers": {"Bad Name": "x"}}, "args.headers: header name 'Bad Name' is not a valid"),
    ("http.post", {"url": URL, "headers": {"X-A": "a\r\nInjected: 1"}}, "args.headers: header 'X-A' has a line break"),
    ("http.post", {"url": URL, "headers": {"X-A": ["list"]}}, "args.headers: header 'X-A' must be a string"),
    ("http.post", {"url": "ftp://example.test/"}, "args.url: must be an http(s) URL"),
    ("http.get", {"url": "http://example.test:99999/"}, "args.url: is not a valid URL"),
    ("http.post", {"url": "http://me:s3cret@example.test/"}, "args.url: carries a user name or password (user:pass@host), which is never sent"),
    ("http.get", {"url": "https://token@example.test/"}, "args.url: carries a user name or password"),
    ("http.post", {"url": URL, "json": {}, "body": "x"}, "args: give 'json' or 'body', not both"),
    ("file.write", {"path": "../out.txt", "content": "x"}, "args.path: outside the file root"),
    ("file.write", {"path": ".", "content": "x"}, "args.path: names the file root itself"),
    ("file.read", {"path": "/etc/passwd"}, "args.path: outside the file root"),
    ("sql.execute", {"sql": "DELETE FROM t"}, "args.database: no database is configured for sql.execute (LOOP_SQL_DATABASES)"),
    ("sql.execute", {"database": "default", "sql": "DELETE FROM t"}, "args.database: the loop's own database 'default' is off limits"),
    ("sql.execute", {"database": "shop", "sql": "x"}, "args.database: no database 'shop'"),
    ("shell.run", {"argv": ["true"]}, "tool 'shell.run' is off: shell.run is disabled"),
    ("email.send", {"to": [], **MAIL}, "args.to: must name at least one recipient"),
    ("email.send", {"to": ["dad@example.test", "bob"], **MAIL}, "args.to[1]: 'bob' is not an email address"),
    ("email.send", {"to": ["dad@example.test"], "cc": ["@x"], **MAIL}, "args.cc[0]: '@x' is not an email"),
    ("email.send", {"to": ["Dad <dad@example.test>"], "from": "me", **MAIL}, "args.from: 'me' is not an email"),
    ("email.send", {"to": ["dad@example.test"], "subject": "a\nBcc: x@y.z", "body": "x"}, "args.subject: has a line break"),
    ("sleep", {"seconds": -1}, "args.seconds: must be between 0 and 86400"),
]  # fmt: skip


def refusal(tool: str, args: dict[str, Any]) -> list[str]:
    with pytest.raises(plans.PlanError) as caught:
        plans.validate({"title": "T", "steps": [step("w", tool, args=args, confirm_before=True)]})
    return caught.value.errors


@pytest.mark.parametrize(
    ("tool", "args", "said"), REFUSED, ids=[f"{r[0]}-{r[2][:24]}" for r in REFUSED]
)
def test_a_plan_that_could_only_fail_after_approval_is_refused_naming_step_and_field(
    file_root: Path, tool: str, args: dict[str, Any], said: str
) -> None:
    found = refusal(tool, args)
    assert len(found) == 1 and found[0].startswith(f"step 'w': {said}"), found


@pytest.mark.parametrize(
    ("tool", "args"),
    [
        ("http.post", {"url": URL, "headers": {"X-Order": 42, "Host": "example.test"}}),
        ("file.write", {"path": "sub/note.txt", "content": "x"}),
        ("email.send", {"to": ["Dad <dad@example.test>"], "cc": ["a@b.example"], **MAIL}),
        ("sleep", {"seconds": 0.5}),
    ],
)
def test_what_can_be_done_is_accepted(file_root: Path, tool: str, args: dict[str, Any]) -> None:
    assert plans.validate({"title": "T", "steps": [step("w", tool, args=args)]}).steps


def test_shell_run_when_enabled_checks_argv_cwd_and_timeout(file_root: Path, settings: Any) -> None:
    settings.LOOP_SHELL_ENABLED = True
    assert refusal("shell.run", {"argv": []}) == ["step 'w': args.argv: must name a program"]
    assert refusal("shell.run", {"argv": ["true"], "cwd": "../"}) == [
        "step 'w': args.cwd: outside the file root"
    ]
    assert refusal("shell.run", {"argv": ["true"], "timeout": 0})[0].startswith(
        "step 'w': args.timeout: must be above 0"
    )


def test_sql_execute_with_a_configured_database_is_accepted(
    db: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dj_database_url
    from django.conf import settings

    url = f"sqlite:///{tmp_path / 'shop.sqlite3'}"
    monkeypatch.setitem(settings.DATABASES, "shop", dj_database_url.parse(url))
    assert refusal("sql.execute", {"database": "shop", "sql": "  "}) == [
        "step 'w': args.sql: empty"
    ]
    assert make_task(step("w", "sql.execute", args={"database": "shop", "sql": "SELECT 1"}))


def test_fields_filled_from_an_earlier_output_are_left_for_run_time(file_root: Path) -> None:
    spec = plans.validate(
        {
            "title": "T",
            "steps": [
                step("where", args={"value": "../out.txt"}),
                step("w", "file.write", args={"path": "${where.value}", "content": "x"}),
                step("h", "http.post", args={"url": "${where.value}", "headers": {"X-A": "${where.value}"}}),
            ],
        }
    )  # fmt: skip
    assert [s.key for s in spec.steps] == ["where", "w", "h"]
    # A header's name is in the plan even when its value is not: the name is checked now.
    assert refusal("http.post", {"url": URL, "headers": {"Content-Length": "${a.b}"}}) != []


def test_the_api_refuses_it_before_anything_is_asked(dad: User, file_root: Path) -> None:
    _, token = issue(name="pippa", user=dad)
    client = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
    plan = {
        "title": "pay",
        "steps": [step("pay", "http.post", args={"url": URL, "headers": {"Content-Length": "1"}}, confirm_before=True)],
    }  # fmt: skip
    response = client.post(
        "/api/tasks", plan, content_type="application/json", headers={"Idempotency-Key": "k1"}
    )
    assert response.status_code == 400
    assert response.json()["detail"].startswith("step 'pay': args.headers: header 'Content-Length'")
    assert not Task.objects.exists() and not Step.objects.exists()


def test_the_dashboard_and_add_steps_refuse_it_too(dad: User, file_root: Path) -> None:
    client = Client()
    client.force_login(dad)
    bad = "title: T\nsteps:\n  - {key: w, tool: file.write, args: {path: ../x, content: y}}\n"
    response = client.post(reverse("loop:new_task"), {"plan": bad})
    assert response.status_code == 400
    assert response.context["form"].errors["plan"] == ["step 'w': args.path: outside the file root"]
    task = make_task(step("a"))
    added = client.post(
        reverse("loop:add_steps", args=[task.pk]),
        {"steps": "- {key: s, tool: sql.execute, args: {sql: DELETE FROM t}}\n", "after": ""},
    )
    assert added.status_code == 400
    assert "step &#x27;s&#x27;: args.database: no database is configured" in added.content.decode()
    assert Task.objects.count() == 1 and Step.objects.count() == 1


def test_an_agents_effect_call_is_checked_once_its_args_are_resolved(
    dad: User, file_root: Path
) -> None:
    """The path comes from the agent's own output for an earlier step: checked when the agent
    asks for the effect, and nothing is written."""
    _, token = issue(name="pippa", user=dad)
    client = Client(HTTP_AUTHORIZATION=f"Bearer {token}")

    def post(path: str, body: dict[str, Any]) -> Any:
        headers = {"Idempotency-Key": uuid.uuid4().hex}
        return client.post(path, body, content_type="application/json", headers=headers)

    task = make_task(
        step("where", args={"value": "x"}),
        step("w", "file.write", args={"path": "${where.value}", "content": "y"}),
        driver="pippa",
    )
    first = post(f"/api/tasks/{task.pk}/next", {}).json()
    done = {"lease_token": first["lease_token"], "verdict": "done", "output": {"value": "../x"}}
    assert post(f"/api/steps/{first['step']['id']}/commit", done).status_code == 200
    taken = post(f"/api/tasks/{task.pk}/next", {}).json()
    assert taken["step"]["key"] == "w"
    args = {"path": "../x", "content": "y"}
    body = {"lease_token": taken["lease_token"], "step": taken["step"]["id"], "tool": "file.write", "args": args}  # fmt: skip
    response = post("/api/effects", body)
    assert response.status_code == 400, response.json()
    assert response.json()["detail"] == "step 'w': args.path: outside the file root"
    assert not (file_root.parent / "x").exists()


def test_a_password_in_a_url_is_refused_without_being_repeated(file_root: Path) -> None:
    found = refusal("http.post", {"url": "http://me:s3cret@example.test/pay"})
    assert found and not any("s3cret" in problem for problem in found), found
