"""A dashboard or admin form larger than Django reads (DATA_UPLOAD_MAX_MEMORY_SIZE, 2.5 MB) or
with too many fields: a page that says why (413 / 400), nothing created, no traceback logged.
Before, the CSRF check hit the limit first: a bare "Bad Request (400)" and an ERROR with a
traceback in the server's log."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from django.test import Client

from loop.api.core import issue
from loop.models import Task


def posting(dad: Any) -> Client:
    client = Client(enforce_csrf_checks=True)
    client.force_login(dad)
    client.get("/tasks/new")
    return client


def test_a_plan_pasted_past_the_limit_is_refused_with_the_reason(
    dad: Any, caplog: pytest.LogCaptureFixture
) -> None:
    client = posting(dad)
    token = client.cookies["csrftoken"].value
    with caplog.at_level(logging.INFO):
        answer = client.post("/tasks/new", {"csrfmiddlewaretoken": token, "plan": "x" * 3_000_000})
    assert answer.status_code == 413
    page = answer.content.decode()
    assert "The form is larger than 2,621,440 bytes" in page
    assert "A plan may be at most 524,288 bytes" in page
    assert not Task.objects.exists()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


def test_too_many_fields_is_refused_with_the_reason(dad: Any) -> None:
    client = posting(dad)
    fields = {f"f{i}": "1" for i in range(1100)}
    answer = client.post("/tasks/new", fields)
    assert answer.status_code == 400
    assert "too many fields" in answer.content.decode()


def test_the_admin_login_too(db: None) -> None:
    answer = Client().post("/admin/login/", {"username": "dad", "password": "p" * 3_000_000})
    assert answer.status_code == 413


def test_the_api_keeps_its_own_json_answer(dad: Any) -> None:
    _, token = issue(name="pippa", user=dad)
    answer = Client().post(
        "/api/tasks",
        b"{}" + b" " * 3_000_000,
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}", "Idempotency-Key": "k"},
    )
    assert answer.status_code == 413
    assert "DATA_UPLOAD_MAX_MEMORY_SIZE" in answer.json()["detail"]
