"""Every API error is JSON with a `detail` naming the problem (issue 12): unknown paths, wrong
methods, bodies too large or not JSON; and the OpenAPI document says what the server enforces."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client

from loop.api.core import issue
from loop.models import Receipt, Step, Task

from .conftest import make_task, step

PLAN = b'{"title": "T", "steps": [{"key": "a", "tool": "echo", "args": {"value": 1}}]}'


@pytest.fixture
def agent(dad: User) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {issue(name='pippa', user=dad)[1]}")


def post(client: Client, path: str, body: bytes, content_type: str, **headers: str) -> Any:
    headers.setdefault("Idempotency-Key", uuid.uuid4().hex)
    return client.generic("POST", path, body, content_type=content_type, headers=headers)


def detail(response: Any, status: int) -> str:
    assert response.status_code == status, response.content[:300]
    assert response["Content-Type"] == "application/json"
    said = response.json()["detail"]
    assert isinstance(said, str) and said
    return said


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/api/tasks/abc"),
        ("GET", "/api/nothing/here"),
        ("POST", "/api/tasks/abc/pause"),
        ("DELETE", "/api/steps/x/commit"),
        ("GET", "/api/tasks/"),  # no trailing slashes
        ("GET", "/api"),
    ],
)
def test_an_unknown_api_path_is_a_json_404_naming_it(agent: Client, method: str, path: str) -> None:
    response = agent.generic(method, path)
    assert detail(response, 404) == f"path: no API endpoint {path} (see /api/openapi.json)"


def test_a_missing_task_or_step_is_a_json_404(agent: Client) -> None:
    assert detail(agent.get("/api/tasks/999"), 404) == "task: no task 999"
    unblock = post(agent, "/api/steps/999/unblock", b'{"decision": "allow"}', "application/json")
    assert detail(unblock, 404) == "step: no step 999"


def test_another_method_is_a_json_405(agent: Client) -> None:
    response = agent.delete("/api/tasks")
    assert detail(response, 405) == "method: DELETE is not allowed here; use GET, POST"
    assert response["Allow"] == "GET, POST"


def test_a_body_over_the_upload_limit_is_a_json_413_and_nothing_is_created(agent: Client) -> None:
    big = PLAN[:-1] + b', "pad": "' + b"x" * settings.DATA_UPLOAD_MAX_MEMORY_SIZE + b'"}'
    response = post(agent, "/api/tasks", big, "application/json")
    said = detail(response, 413)
    assert said == "body: larger than 2621440 bytes (DATA_UPLOAD_MAX_MEMORY_SIZE)"
    assert not Task.objects.exists() and not Receipt.objects.exists()


@pytest.mark.parametrize(
    ("content_type", "said"),
    [
        ("multipart/form-data", "Content-Type: send application/json, not 'multipart/form-data'"),
        ("multipart/form-data; boundary=x", "Content-Type: send application/json, not 'multipart"),
        ("application/x-www-form-urlencoded", "Content-Type: send application/json, not 'applic"),
        ("text/plain", "Content-Type: send application/json, not 'text/plain'"),
        ("", "Content-Type: send application/json, not"),
        ("application/json; charset=utf-16", "Content-Type: the body must be UTF-8, not 'utf-16'"),
    ],
)
def test_a_body_that_is_not_json_is_a_json_415(agent: Client, content_type: str, said: str) -> None:
    response = post(agent, "/api/tasks", PLAN, content_type)
    assert detail(response, 415).startswith(said)
    assert not Task.objects.exists()


def test_json_with_a_charset_and_an_empty_body_of_any_type_are_fine(agent: Client) -> None:
    created = post(agent, "/api/tasks", PLAN, "application/json; charset=utf-8")
    assert created.status_code == 201
    task = Task.objects.get()
    assert post(agent, f"/api/tasks/{task.pk}/pause", b"", "text/plain").status_code == 200


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (b"{oops", "body: not valid JSON"),
        (b'{"title": NaN}', "title: NaN is not allowed; numbers must be finite"),
        (b'{"title": ' + b"[" * 5000 + b"]" * 5000 + b"}", "body: nested more than"),
        (b'{"title": ' + b"[" * 50 + b"]" * 50 + b"}", "title[0][0][0]"),
        (b"[1, 2]", "body: must be a JSON object"),
    ],
)
def test_a_malformed_body_is_a_json_400(agent: Client, body: bytes, said: str) -> None:
    response = post(agent, "/api/tasks", body, "application/json")
    assert detail(response, 400).startswith(said)
    assert not Task.objects.exists()


def test_idempotency_key_rules_are_json_errors_too(agent: Client) -> None:
    empty = post(agent, "/api/tasks", PLAN, "application/json", **{"Idempotency-Key": " "})
    assert detail(empty, 400).startswith("Idempotency-Key: header required")
    long = post(agent, "/api/tasks", PLAN, "application/json", **{"Idempotency-Key": "k" * 256})
    assert detail(long, 400) == "Idempotency-Key: at most 255 characters"
    assert post(agent, "/api/tasks", PLAN, "application/json", **{"Idempotency-Key": "k"})
    other = post(agent, "/api/tasks", PLAN.replace(b"1}", b"2}"), "application/json", **{"Idempotency-Key": "k"})  # fmt: skip
    assert detail(other, 409) == "Idempotency-Key: already used with another body"
    assert Task.objects.count() == 1


def test_the_openapi_document_says_what_the_server_enforces(db: None) -> None:
    doc = Client().get("/api/openapi.json").json()
    key = doc["components"]["parameters"]["IdempotencyKey"]
    assert key["required"] is True
    assert key["schema"]["minLength"] == 1 and key["schema"]["maxLength"] == 255
    assert "409" in key["description"] and "400" in key["description"]
    assert doc["components"]["schemas"]["Error"]["required"] == ["detail"]
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            answers = operation["responses"]
            if path == "/api/openapi.json":
                continue
            assert "401" in answers, (method, path)
            if method == "post":
                assert {"400", "403", "409", "413", "415"} <= set(answers), path
                assert "reused" in answers["409"]["description"]
    assert "64 KB" in doc["info"]["description"]


def test_a_step_in_a_task_is_found_after_all(agent: Client) -> None:
    """The catch-all 404 is last: a real route is still served."""
    task = make_task(step("a"))
    assert agent.get(f"/api/tasks/{task.pk}").json()["steps"][0]["key"] == "a"
    assert Step.objects.count() == 1


def test_a_body_refused_for_a_field_is_the_commands_answer_too(agent: Client) -> None:
    """A wrong type or an unknown field is refused before the command runs, and that refusal
    is kept as its receipt: the same key replays it, and can't run another body."""
    task = make_task(step("a"))
    path = f"/api/tasks/{task.pk}/pause"
    key = {"Idempotency-Key": "k"}
    bad = post(agent, path, b'{"surprise": 1}', "application/json", **key)
    assert detail(bad, 400) == "surprise: unknown field"
    again = post(agent, path, b'{"surprise": 1}', "application/json", **key)
    assert again.json() == bad.json() and again["Idempotent-Replayed"] == "true"
    other = post(agent, path, b"{}", "application/json", **key)
    assert detail(other, 409) == "Idempotency-Key: already used with another body"
    assert Task.objects.get(pk=task.pk).state == "running"
    wrong_type = post(agent, f"/api/steps/{task.steps.get().pk}/commit", b'{"lease_token": 5}', "application/json")  # fmt: skip
    assert detail(wrong_type, 400) == "lease_token: must be a string"
    assert "verdict: required" in wrong_type.json()["errors"]


def test_a_host_that_is_not_allowed_gets_a_json_400_under_the_api(client: Client) -> None:
    refused = client.get("/api/tasks", HTTP_HOST="n")
    assert refused.status_code == 400
    assert refused["Content-Type"] == "application/json"
    assert refused.json()["detail"] == "Host: not a host this server answers to (ALLOWED_HOSTS)"
    page = client.get("/", HTTP_HOST="n")  # elsewhere Django's own page
    assert page.status_code == 400 and page["Content-Type"].startswith("text/html")
