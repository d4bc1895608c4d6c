"""Schemathesis against /api/openapi.json: over a thousand requests generated from the
document (derandomized, so CI sees the same ones), sent through the WSGI app as an agent with
every permission: requests that fit the document, and requests that break it in one place
(a wrong type, a missing field, an extra header...). Then a few hundred more, each made hostile
in one place more (`Hostile`): a query or path parameter, a field of the body, or an `after`
the operation does not take, given what people and attackers type for a number or a name —
digits of other scripts ('²', '١٢', '１２'), signs, blanks, NUL, huge integers, references —
and every operation gets such requests. No answer is a 5xx, nothing is logged with a
traceback, and every answer's status, headers and body are the ones the document promises for
that operation.

Generated ids and lease tokens would almost never name a real row or lease, so most requests
would stop at a 404 or 403; small generated ids are mapped onto the rows that exist, and some
lease tokens onto the ones `next` answered, so the commands run for real as well.
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import schemathesis
from django.contrib.auth.models import User
from django.core.signals import request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from django.test import override_settings
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from loop.api.core import KEY_HEADER, issue
from loop.models import CLAIMABLE_TASK_STATES, Step, Task

from .conftest import make_task, step

# the API's contract and its refusals: database-independent, tried on the SQLite run
pytestmark = pytest.mark.sqlite_only

REQUESTS = 1200
# What a hostile request carries in one place. Text goes anywhere; a lone surrogate or a NUL
# only into a JSON body (a query string or a path can't carry one).
HOSTILE_TEXT = [
    "²", "١٢", "１２", "12²", " 12", "12 ", "+12", "1_0", "12.0", "-0", "0x1f", "1e3",
    "9" * 40, "", "NaN", "∞", "%00", "../../etc/passwd", "${secret:PAY_TOKEN}", "${a.b}",
    "<script>", "\u202e", "task-²",
]  # fmt: skip
BODY_ONLY = ["a\x00b", "\ud800"]
HOSTILE_REQUESTS = 300
HOSTILE_NUMBERS = [2**63, -(2**63) - 1, 2**64, -1, 0, 1e308, -0.0, True, "12", "²"]
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
NEAR = 1000  # generated ids below this are mapped onto existing rows


@pytest.fixture
def wsgi_app(db: None) -> Iterator[Any]:
    """The site's WSGI app inside this test's transaction: like Django's test client, a
    request must not close the connection that holds it."""
    request_started.disconnect(close_old_connections)
    try:
        yield get_wsgi_application()
    finally:
        request_started.connect(close_old_connections)


class Agent:
    """What the generated requests are sent with, and what it learned from the answers."""

    def __init__(self, token: str) -> None:
        self.token = token
        self.leases: dict[int, str] = {}  # step id -> the lease token `next` answered for it
        self.statuses: Counter[str] = Counter()

    def headers(self, case: Any) -> dict[str, str]:
        """The token, and for a POST a fresh command id: generated keys repeat (short strings
        are favoured) and a reused key is a 409 before the command runs. Replays are tested
        in test_api.py."""
        fresh = {KEY_HEADER: uuid.uuid4().hex} if case.method.upper() == "POST" else {}
        return {"Authorization": f"Bearer {self.token}", **fresh}

    def aim(self, case: Any) -> None:
        """Small generated ids name existing tasks and steps; a lease token of even length
        becomes one that `next` answered (most often the latest), with its step."""
        params = case.path_parameters or {}
        for name, model in (("task_id", Task), ("step_id", Step)):
            if isinstance(params.get(name), int) and 0 <= params[name] < NEAR:
                rows = model.objects.order_by("pk")
                if case.path.endswith("/next"):  # aim `next` at tasks it may take (if any)
                    rows = rows.filter(state__in=CLAIMABLE_TASK_STATES) or rows
                ids = list(rows.values_list("pk", flat=True))
                params[name] = ids[params[name] % len(ids)]
        body = case.body
        if not isinstance(body, dict):
            return
        step_id = body.get("step")
        if isinstance(step_id, int) and not isinstance(step_id, bool) and 0 <= step_id < NEAR:
            ids = list(Step.objects.order_by("pk").values_list("pk", flat=True))
            body["step"] = step_id = ids[step_id % len(ids)]
        token = body.get("lease_token")
        if self.leases and isinstance(token, str) and len(token) % 2 == 0:
            latest_first = list(reversed(self.leases.items()))
            held, body["lease_token"] = latest_first[len(token) // 2 % len(latest_first)]
            if "step_id" in params:
                params["step_id"] = held
            elif "step" in body:
                body["step"] = held

    def learn(self, case: Any, response: Any) -> None:
        self.statuses[f"{case.method.upper()} {case.path} {response.status_code}"] += 1
        if case.path.endswith("/next") and response.status_code == 200:
            answer = response.json()
            if answer.get("lease_token"):
                self.leases[answer["step"]["id"]] = answer["lease_token"]


def hostile_text(body: bool = False) -> st.SearchStrategy[str]:
    """What people and attackers type: the listed values, or a few characters of digits of any
    script, numeric symbols and blanks."""
    typed = st.text(alphabet=st.characters(categories=("Nd", "No", "Nl", "Zs")), max_size=4)
    listed = HOSTILE_TEXT + (BODY_ONLY if body else [])
    return st.one_of(st.sampled_from(listed), typed)


class Hostile:
    """Makes a generated request hostile in one place, and counts that per operation."""

    def __init__(self) -> None:
        self.sent: Counter[str] = Counter()

    def spoil(self, case: Any, data: st.DataObject) -> None:
        """Draw one place of the request and a hostile value for it, and put it there."""
        places = [("query", k) for k in case.query or {}]
        places += [("path", k) for k in case.path_parameters or {}]
        places += [("body", path) for path in _leaves(case.body)]
        places.append(("query", "after"))  # taken by some operations, ignored by the others
        where, name = data.draw(st.sampled_from(places))
        if where == "body":
            spoiled = data.draw(
                st.one_of(hostile_text(body=True), st.sampled_from(HOSTILE_NUMBERS))
            )
        else:
            spoiled = data.draw(hostile_text())
        if where == "query":
            case.query = {**(case.query or {}), name: spoiled}
        elif where == "path":  # as a client puts it in a path: quoted, a '/' too
            case.path_parameters = {**case.path_parameters, name: quote(spoiled, safe="")}
        else:
            case.body = _replaced(case.body, name, spoiled)
        self.sent[f"{case.method.upper()} {case.path}"] += 1


def _leaves(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """The paths of a body's values that are not objects or lists (an empty one counts)."""
    if isinstance(value, dict) and value:
        return [p for k, v in value.items() for p in _leaves(v, (*path, k))]
    if isinstance(value, list) and value:
        return [p for i, v in enumerate(value) for p in _leaves(v, (*path, i))]
    return [path] if path or isinstance(value, dict | list) else []


def _replaced(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    head, *rest = path
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[head] = _replaced(value[head], tuple(rest), new)
    return copy


def some_tasks() -> None:
    """Dad's tasks, given to the agent `pippa` the test drives them as (an agent drives only
    the tasks it created or was given)."""
    make_task(step("a"), step("b"), driver="pippa")
    write = {"path": "w.txt", "content": "x"}
    make_task(step("w", "file.write", args=write, side_effect=True), driver="pippa")
    pay = {"path": "p.txt", "content": "x"}
    make_task(step("pay", "file.write", args=pay, confirm_before=True), driver="pippa")


def no_tracebacks(caplog: pytest.LogCaptureFixture) -> None:
    tracebacks = [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert tracebacks == [], [r.getMessage() for r in tracebacks]


def bounded(requests: int) -> settings:
    return settings(
        max_examples=requests,
        derandomize=True,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
    )


@pytest.mark.timeout(240)  # about a minute on an idle 2-core machine; a hard ceiling when loaded
# A model is configured (none is asked: no worker runs), so a generated `goal` creates a task
# Pippa would plan, and `judge: model` steps are plans like any other.
@override_settings(LOOP_LLM_BASE_URL="http://127.0.0.1:9/v1")
def test_generated_requests_get_documented_answers(
    wsgi_app: Any, dad: User, file_root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    agent = Agent(issue(name="pippa", user=dad)[1])
    some_tasks()
    schema = schemathesis.openapi.from_wsgi("/api/openapi.json", wsgi_app)

    fitting = schema.as_strategy(generation_mode=GenerationMode.POSITIVE)
    breaking = schema.as_strategy(generation_mode=GenerationMode.NEGATIVE)
    caplog.set_level(logging.WARNING)

    @given(case=st.one_of(fitting, breaking))
    @bounded(REQUESTS)
    def answer(case: Any) -> None:
        agent.aim(case)
        agent.learn(case, case.call_and_validate(headers=agent.headers(case), checks=CHECKS))

    answer()
    sent = agent.statuses
    server_errors = sum(n for said, n in sent.items() if said.rsplit(" ", 1)[1].startswith("5"))
    print(f"schemathesis: {sum(sent.values())} requests sent, {server_errors} answered 5xx")
    assert server_errors == 0, sent
    assert sum(sent.values()) >= 1000, sent
    every = {f"{o.method.upper()} {o.path}" for o in (r.ok() for r in schema.get_all_operations())}
    assert {s.rsplit(" ", 1)[0] for s in sent} == every  # each operation was tried
    succeeded = {s.rsplit(" ", 1)[0] for s in sent if s.endswith((" 200", " 201"))}
    # The commands ran for real, not only their refusals.
    assert {"POST /api/tasks", "POST /api/tasks/{task_id}/next"} <= succeeded, sent
    no_tracebacks(caplog)


@pytest.mark.timeout(120)  # about 10 s on an idle 2-core machine
@override_settings(LOOP_LLM_BASE_URL="http://127.0.0.1:9/v1")
def test_hostile_requests_to_every_operation_get_documented_answers(
    wsgi_app: Any, dad: User, file_root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Each request fits the document, or breaks it in one place, and is then made hostile in
    one place more (`Hostile`)."""
    agent = Agent(issue(name="pippa", user=dad)[1])
    some_tasks()
    hostile = Hostile()
    schema = schemathesis.openapi.from_wsgi("/api/openapi.json", wsgi_app)
    operations = [r.ok() for r in schema.get_all_operations()]
    every = {f"{o.method.upper()} {o.path}" for o in operations}
    caplog.set_level(logging.WARNING)
    for operation in operations:  # each operation its share: none is left to the draw
        fitting = operation.as_strategy(generation_mode=GenerationMode.POSITIVE)
        breaking = operation.as_strategy(generation_mode=GenerationMode.NEGATIVE)

        @given(case=st.one_of(fitting, breaking), data=st.data())
        @bounded(max(4, HOSTILE_REQUESTS // len(operations)))
        def answer(case: Any, data: st.DataObject) -> None:
            agent.aim(case)
            hostile.spoil(case, data)
            agent.learn(case, case.call_and_validate(headers=agent.headers(case), checks=CHECKS))

        answer()
    sent = agent.statuses
    server_errors = sum(n for said, n in sent.items() if said.rsplit(" ", 1)[1].startswith("5"))
    print(f"schemathesis: {sum(hostile.sent.values())} hostile requests: {dict(hostile.sent)}")
    assert server_errors == 0, sent
    assert set(hostile.sent) == every, hostile.sent  # every operation got hostile input
    no_tracebacks(caplog)
