"""Degrade, don't fail (DESIGN.md §8, issue 25). With Redis down the login, the API and the
pages keep working (the throttles count in this process, said once in the log) and a live
socket closes as "paused" (4503), not with 1011 and a traceback. With the database down every
page and API call answers 503 with a short reason (JSON under /api/), never a 500; a full disk
is a 503 naming it, with nothing created."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from channels.layers import DEFAULT_CHANNEL_LAYER, channel_layers
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.db import OperationalError, connection
from django.db.backends.base.base import BaseDatabaseWrapper
from django.test import Client

from loop import throttle
from loop.api.core import issue
from loop.models import Task
from loop.web import unavailable
from loop.web.consumers import LiveConsumer
from loop.web.unavailable import UNAVAILABLE, SocketUnavailable
from loop.worker import Worker

from .test_live_consumer import ORIGIN, run

NOBODY = "redis://127.0.0.1:1/0"  # nothing listens on port 1: a Redis that is down
PLAN = {"title": "t", "steps": [{"key": "a", "tool": "echo", "args": {"value": 1}}]}


@pytest.fixture
def redis_down(settings: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    settings.REDIS_URL = NOBODY
    settings.CACHES = {
        **settings.CACHES,
        "throttle": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": NOBODY,
            "OPTIONS": {"socket_connect_timeout": 0.5, "socket_timeout": 0.5},
        },
    }
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [NOBODY]},
        }
    }
    monkeypatch.setattr(throttle, "_local_until", 0.0)
    monkeypatch.setattr(unavailable, "_said", {})
    channel_layers.backends.pop(DEFAULT_CHANNEL_LAYER, None)
    yield
    channel_layers.backends.pop(DEFAULT_CHANNEL_LAYER, None)


def log_in(client: Client, password: str) -> int:
    return client.post("/accounts/login/", {"username": "dad", "password": password}).status_code


def test_with_redis_down_login_and_the_api_work_and_the_throttle_still_counts(
    dad: User, worker: Worker, redis_down: None, caplog: pytest.LogCaptureFixture, settings: Any
) -> None:
    settings.PIPPA_TOKEN_IP_LIMIT = 3
    _, token = issue(name="pippa", user=dad)
    with caplog.at_level(logging.INFO, logger="loop.throttle"):
        assert log_in(Client(), "dad-password-1") == 302
        agent = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
        assert agent.get("/api/tasks").status_code == 200
        created = agent.post(
            "/api/tasks", PLAN, content_type="application/json", HTTP_IDEMPOTENCY_KEY="k1"
        )
        assert created.status_code == 201, created.content
        assert Client().get("/").status_code == 302  # the pages: to the login, as ever

        guesser = Client()
        answers = [log_in(guesser, f"guess-{n}") for n in range(8)]
        assert answers == [200] * 5 + [429] * 3  # counted in this process: never unlimited
        wrong = Client(HTTP_AUTHORIZATION="Bearer nope")
        assert [wrong.get("/api/tasks").status_code for _ in range(4)] == [401] * 3 + [429]
    said = [r for r in caplog.records if "Redis does not answer" in r.getMessage()]
    assert len(said) == 1, "said once, not once per request"
    health = Client().get("/healthz")
    assert health.status_code == 200
    [reason] = health.json()["degraded"]
    assert reason.startswith("redis unreachable") and "live updates paused" in reason


def test_with_redis_down_a_live_socket_closes_as_paused_without_a_traceback(
    dad: User, redis_down: None, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> None:
        for _ in range(3):  # a page reconnecting: each closes as paused, said once a minute
            socket = WebsocketCommunicator(
                SocketUnavailable(LiveConsumer.as_asgi()), "/ws/live?topic=home&after=0", ORIGIN
            )
            socket.scope["user"] = dad
            connected, _ = await socket.connect(timeout=10)
            assert connected
            closed = await socket.receive_output(timeout=10)
            assert closed["type"] == "websocket.close" and closed["code"] == UNAVAILABLE
            assert closed["reason"].startswith("live updates paused: the channel layer")
            await socket.wait()

    with caplog.at_level(logging.INFO):
        run(scenario)
    paused = [r for r in caplog.records if "live updates paused" in r.getMessage()]
    assert len(paused) == 1 and paused[0].exc_info is None
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.fixture
def database_down(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every new statement finds the server gone, as psycopg says it (and Django wraps it)."""

    def refused(self: BaseDatabaseWrapper) -> None:
        raise OperationalError(
            'connection failed: connection to server at "127.0.0.1", port 5432 failed: '
            "Connection refused\n\tIs the server running on that host?"
        )

    with monkeypatch.context() as patch:
        patch.setattr(unavailable, "_said", {})  # said once a minute: from this test on
        patch.setattr(BaseDatabaseWrapper, "ensure_connection", refused)
        yield


def test_with_the_database_down_pages_and_the_api_answer_503_with_the_reason(
    dad: User, caplog: pytest.LogCaptureFixture, request: pytest.FixtureRequest
) -> None:
    _, token = issue(name="pippa", user=dad)
    browser = Client(raise_request_exception=False)
    browser.force_login(dad)
    agent = Client(HTTP_AUTHORIZATION=f"Bearer {token}", raise_request_exception=False)
    reason = "database unavailable: connection failed: connection to server at"
    with caplog.at_level(logging.WARNING, logger="loop.web.unavailable"):
        request.getfixturevalue("database_down")
        for answer in (browser.get("/"), browser.get("/tasks/new"), browser.get("/conversation")):
            assert answer.status_code == 503
            assert reason in answer.content.decode() and "Traceback" not in answer.content.decode()
            assert answer["Retry-After"] == "5"
        login = Client(raise_request_exception=False).post(
            "/accounts/login/", {"username": "dad", "password": "dad-password-1"}
        )
        assert login.status_code == 503
        for answer in (
            agent.get("/api/tasks"),
            agent.post(
                "/api/tasks", PLAN, content_type="application/json", HTTP_IDEMPOTENCY_KEY="k"
            ),
        ):
            assert answer.status_code == 503
            assert answer.json()["detail"].startswith(reason)
        health = Client().get("/healthz")
        assert health.status_code == 503 and health["Content-Type"] == "application/json"
        assert health.json()["problems"][0].startswith("database unreachable: connection failed")
    said = [r for r in caplog.records if r.name == "loop.web.unavailable"]
    assert len(said) == 1, "one line a minute, not one per request"
    assert not [r for r in caplog.records if r.exc_info], "no traceback"


@pytest.mark.skipif(
    "postgres" in str(connection.settings_dict.get("ENGINE", "")),
    reason="SQLITE_FULL is SQLite's; a full PostgreSQL disk is an OperationalError alike",
)
def test_a_full_disk_answers_503_naming_it_and_creates_nothing(
    transactional_db: None, dad: User
) -> None:
    _, token = issue(name="pippa", user=dad)
    agent = Client(HTTP_AUTHORIZATION=f"Bearer {token}", raise_request_exception=False)
    big = {**PLAN, "steps": [{**PLAN["steps"][0], "args": {"value": "x" * 200_000}}]}  # type: ignore[dict-item]
    with connection.cursor() as cursor:
        cursor.execute("VACUUM")  # no free pages: the plan needs new ones
        cursor.execute("PRAGMA page_count")
        cursor.execute(f"PRAGMA max_page_count = {cursor.fetchone()[0]}")
    try:
        full = agent.post(
            "/api/tasks", big, content_type="application/json", HTTP_IDEMPOTENCY_KEY="full"
        )
        assert full.status_code == 503, full.content
        assert full.json()["detail"] == "writes failing: database or disk is full"
        assert not Task.objects.exists()
        health = Client().get("/healthz").json()
        assert any(
            p.startswith("writes failing: database or disk is full") for p in health["problems"]
        )
    finally:
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA max_page_count = 1073741823")
    again = agent.post(
        "/api/tasks", big, content_type="application/json", HTTP_IDEMPOTENCY_KEY="ok"
    )
    assert again.status_code == 201 and Task.objects.count() == 1
    assert not [p for p in Client().get("/healthz").json()["problems"] if "writes" in p]
