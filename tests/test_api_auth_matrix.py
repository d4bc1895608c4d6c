"""Every API endpoint against every way of asking without the right: no token, a wrong one, a
revoked one, an expired one, a user without the act's permission, another agent's lease, an
agent acting on a task it does not drive, an agent answering for a person. Each answers 401,
403 or 409 and changes nothing; the same request by an agent with the right succeeds (so each
refusal is about who asks, not about the state). A person's acts (answers, approvals,
schedules) are "allowed" only for a token made with `--answers`.

The cases come from one table, `ENDPOINTS`; a test fails if an /api/ route or method is
missing from it, so a new endpoint cannot be forgotten.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.cache import cache
from django.test import Client, override_settings
from django.utils import timezone

from loop import actions, permissions
from loop.api.core import issue
from loop.api.site import routes
from loop.models import AgentToken, Effect, Event, EventKind, Receipt, Step, Task
from loop.permissions import SYSTEM
from pippa_site.urls import urlpatterns

from .conftest import DAD_PERMISSIONS, make_task, permission_objects, step

# who may call what: database-independent, tried on the SQLite run
pytestmark = pytest.mark.sqlite_only

# ---- the world each case starts from -----------------------------------------------------------


@dataclass
class World:
    open_task: Task  # running, its step pending, nobody holds its lease
    paused: Task
    proposed: Task  # from a goal; its plan waits for approval (LOOP_CONFIRM_PLANS)
    asking: Step  # blocked on "May I do this?"
    held: Step  # running, its task leased by `next` to the holder
    failed: Step  # failed (denied), its task paused with a step still to run
    lease_token: str
    file_root: Path


def post(client: Client, path: str, body: Any) -> Any:
    return client.post(
        path,
        json.dumps(body),
        content_type="application/json",
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )


def agent_client(token: str) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {token}")


def given(task: Task, driver: str) -> Task:
    """The task, given to the agent `driver` by a person (an agent drives only those)."""
    actions.give(task_id=task.pk, agent=driver, actor="test", user=SYSTEM)
    return task


def build_world(holder: Client, driver: str, file_root: Path) -> World:
    open_task = given(make_task(step("a"), title="open"), driver)
    paused = given(make_task(step("p"), title="paused"), driver)
    actions.pause(task_id=paused.pk, actor="test", user=SYSTEM)
    asked = make_task(
        step("pay", "file.write", args={"path": "p.txt", "content": "x"}, confirm_before=True),
        title="asking",
    )
    dad = agent_client(issue(name="dad-agent", user=User.objects.get(username="dad"))[1])
    given(asked, "dad-agent")
    assert post(dad, f"/api/tasks/{asked.pk}/next", {}).json()["step"] is None
    given(asked, driver)
    failing = make_task(
        step("fix", "file.write", args={"path": "f.txt", "content": "x"}, confirm_before=True),
        step("then"),
        title="failing",
    )
    given(failing, "dad-agent")
    assert post(dad, f"/api/tasks/{failing.pk}/next", {}).json()["step"] is None
    failed = failing.steps.get(key="fix")
    actions.unblock(step_id=failed.pk, decision="deny", actor="test", user=SYSTEM)
    given(failing, driver)
    held_task = make_task(
        step("write", "file.write", args={"path": "w.txt", "content": "x"}, side_effect=True),
        title="held",
    )
    given(held_task, driver)
    taken = post(holder, f"/api/tasks/{held_task.pk}/next", {})
    assert taken.status_code == 200, taken.content
    return World(
        open_task=open_task,
        paused=paused,
        proposed=given(proposed(dad), driver),
        asking=asked.steps.get(),
        held=held_task.steps.get(),
        failed=failed,
        lease_token=taken.json()["lease_token"],
        file_root=file_root,
    )


def proposed(planner: Client) -> Task:
    """A task from a goal whose plan waits for approval: an agent took its planning step with
    `next`, added a step (a proposal: an agent wrote it) and committed `done`, as the model
    judge would."""
    with override_settings(LOOP_LLM_BASE_URL="http://127.0.0.1:9/v1", LOOP_CONFIRM_PLANS="always"):
        task = actions.create_task_from_goal(goal="Plan it.", actor="test", user=SYSTEM)
        given(task, "dad-agent")
        taken = post(planner, f"/api/tasks/{task.pk}/next", {}).json()
        assert taken["step"]["key"] == "plan", taken
        added = post(planner, f"/api/tasks/{task.pk}/steps", {"steps": [step("after")]})
        assert added.status_code == 200, added.content
        token = taken["lease_token"]
        done = post(
            planner,
            f"/api/steps/{taken['step']['id']}/commit",
            {"lease_token": token, "verdict": "done"},
        )
        assert done.status_code == 200, done.content
    task.refresh_from_db()
    assert task.state == "paused"
    return task


# ---- the table ---------------------------------------------------------------------------------

Request = Callable[[World], tuple[str, Any]]  # the path and the body (None for a GET)
NEW_PLAN = {"title": "new", "steps": [{"key": "n", "tool": "echo", "args": {"value": 1}}]}


@dataclass(frozen=True)
class Endpoint:
    name: str  # the URL name of its operation (loop/api/)
    method: str
    request: Request
    ok: int  # what an agent with the right gets
    act: str | None  # the act in loop/permissions.py NEEDS; None: a read (any valid token)
    lease: bool = False  # uses a lease token: another agent's is refused
    public: bool = False


ENDPOINTS = [
    Endpoint("api_openapi", "GET", lambda w: ("/api/openapi.json", None), 200, None, public=True),
    Endpoint("api_tasks", "GET", lambda w: ("/api/tasks", None), 200, None),
    Endpoint("api_task_counts", "GET", lambda w: ("/api/tasks/counts", None), 200, None),
    Endpoint("api_tasks", "POST", lambda w: ("/api/tasks", NEW_PLAN), 201, "create a task"),
    Endpoint("api_task", "GET", lambda w: (f"/api/tasks/{w.open_task.pk}", None), 200, None),
    Endpoint(
        "api_add_steps",
        "POST",
        lambda w: (f"/api/tasks/{w.open_task.pk}/steps", {"steps": [step("more")]}),
        200,
        "add steps",
    ),
    Endpoint(
        "api_pause", "POST", lambda w: (f"/api/tasks/{w.open_task.pk}/pause", {}), 200, "pause"
    ),
    Endpoint(
        "api_resume", "POST", lambda w: (f"/api/tasks/{w.paused.pk}/resume", {}), 200, "resume"
    ),
    Endpoint(
        "api_approve",
        "POST",
        lambda w: (f"/api/tasks/{w.proposed.pk}/approve", {}),
        200,
        "approve a plan",
    ),
    Endpoint(
        "api_decline",
        "POST",
        lambda w: (f"/api/tasks/{w.proposed.pk}/decline", {"note": "no"}),
        200,
        "approve a plan",
    ),
    Endpoint(
        "api_supersede",
        "POST",
        lambda w: (f"/api/tasks/{w.open_task.pk}/supersede", NEW_PLAN),
        201,
        "supersede",
    ),
    Endpoint(
        "api_next",
        "POST",
        lambda w: (f"/api/tasks/{w.held.task_id}/next", {}),
        200,
        "drive a step",
        lease=True,
    ),
    Endpoint(
        "api_release",
        "POST",
        lambda w: (f"/api/tasks/{w.held.task_id}/release", {}),
        200,
        "drive a step",
        lease=True,
    ),
    Endpoint(
        "api_commit",
        "POST",
        lambda w: (
            f"/api/steps/{w.held.pk}/commit",
            {"lease_token": w.lease_token, "verdict": "done", "output": {"ok": True}},
        ),
        200,
        "drive a step",
        lease=True,
    ),
    Endpoint(
        "api_renew",
        "POST",
        lambda w: (f"/api/steps/{w.held.pk}/renew", {"lease_token": w.lease_token}),
        200,
        "drive a step",
        lease=True,
    ),
    Endpoint(
        "api_unblock",
        "POST",
        lambda w: (f"/api/steps/{w.asking.pk}/unblock", {"decision": "allow"}),
        200,
        "answer questions",
    ),
    Endpoint(
        "api_retry",
        "POST",
        lambda w: (f"/api/steps/{w.failed.pk}/retry", {}),
        200,
        "retry a step",
    ),
    Endpoint(
        "api_skip", "POST", lambda w: (f"/api/steps/{w.failed.pk}/skip", {}), 200, "skip a step"
    ),
    Endpoint(
        "api_effects",
        "POST",
        lambda w: (
            "/api/effects",
            {
                "lease_token": w.lease_token,
                "step": w.held.pk,
                "tool": "file.write",
                "args": {"path": "w.txt", "content": "x"},  # the step's own call
            },
        ),
        200,
        "drive a step",
        lease=True,
    ),
    Endpoint("api_events", "GET", lambda w: ("/api/events?after=0", None), 200, None),
    Endpoint("api_messages", "GET", lambda w: ("/api/messages", None), 200, None),
    Endpoint(
        "api_messages",
        "POST",
        lambda w: ("/api/messages", {"text": "not this week"}),
        201,
        "write in the conversation",
    ),
    Endpoint("api_schedules", "GET", lambda w: ("/api/schedules", None), 200, None),
    Endpoint(
        "api_schedules",
        "POST",
        lambda w: ("/api/schedules", {**NEW_PLAN, "schedule": "0 8 * * MON"}),
        201,
        "create a schedule",
    ),
]

COLUMNS = (
    "allowed",
    "anonymous",
    "wrong token",
    "revoked",
    "expired",
    "no permission",
    "other lease",
    "not its task",
    "not a person",
)
# The endpoints that act on one task (an agent acts only on the tasks it drives).
ON_A_TASK = {
    "api_add_steps",
    "api_skip",
    "api_pause",
    "api_resume",
    "api_supersede",
    "api_next",
    "api_release",
    "api_commit",
    "api_renew",
    "api_effects",
}


def applies(endpoint: Endpoint, column: str) -> bool:
    if endpoint.public:
        return column in ("allowed", "anonymous")
    if column == "not its task":
        return endpoint.name in ON_A_TASK
    if column == "not a person":
        return endpoint.act in permissions.PERSON_ONLY
    return column != "other lease" or endpoint.lease


CASES = [
    pytest.param(e, c, id=f"{e.method} {e.name} - {c}")
    for e in ENDPOINTS
    for c in COLUMNS
    if applies(e, c)
]


def test_every_api_route_and_method_is_in_the_table() -> None:
    served = {(name, method) for _, method, name in routes()}
    mounted = {p.name for p in urlpatterns if str(p.pattern).startswith("api/") and p.name}
    assert mounted == {name for name, _ in served}
    listed = {(e.name, e.method) for e in ENDPOINTS}
    assert served == listed, f"not in ENDPOINTS: {served - listed}; gone: {listed - served}"
    assert {e.act for e in ENDPOINTS} - {None} <= set(permissions.NEEDS)


# ---- the cases ---------------------------------------------------------------------------------


def snapshot() -> dict[str, Any]:
    """What a refused request must leave as it was; refusals may only journal themselves."""
    return {
        "tasks": list(
            Task.objects.order_by("pk").values(
                "pk", "state", "lease_owner", "lease_epoch", "lease_until", "successor_id"
            )
        ),
        "steps": list(
            Step.objects.order_by("pk").values(
                "pk", "task_id", "position", "key", "state", "attempts", "output", "authorized_by"
            )
        ),
        "effects": list(Effect.objects.order_by("pk").values("pk", "state", "sends")),
        "events": list(
            Event.objects.exclude(kind=EventKind.DECISION_REFUSED)
            .order_by("pk")
            .values_list("pk", flat=True)
        ),
    }


def user_without(act: str) -> User:
    """A user with every permission the loop asks for except those `act` needs."""
    user = User.objects.create_user("nobody-for-this")
    user.user_permissions.add(
        *permission_objects(*(p for p in DAD_PERMISSIONS if p not in permissions.NEEDS[act]))
    )
    return user


@pytest.mark.parametrize(("endpoint", "column"), CASES)
def test_auth_matrix(endpoint: Endpoint, column: str, dad: User, file_root: Path) -> None:
    cache.clear()  # each case starts unthrottled: earlier cases' refused tokens are forgotten
    person = endpoint.act in permissions.PERSON_ONLY
    pippa_token = issue(name="pippa", user=dad, answers=person and column == "allowed")[1]
    holder = agent_client(pippa_token)
    driver = "pippa"
    asker: Client
    if column == "allowed":
        asker = holder
    elif column == "anonymous":
        asker = Client()
    elif column == "wrong token":
        asker = agent_client("not-a-token-" + uuid.uuid4().hex)
    elif column == "revoked":
        agent, token = issue(name="revoked", user=dad)
        AgentToken.objects.filter(pk=agent.pk).update(revoked=True)
        asker = agent_client(token)
    elif column == "expired":
        if not hasattr(AgentToken, "expires_at"):
            pytest.skip("tokens do not expire yet (AgentToken.expires_at: branch `hygiene`)")
        agent, token = issue(name="expired", user=dad)
        past = timezone.now() - timedelta(seconds=1)
        AgentToken.objects.filter(pk=agent.pk).update(expires_at=past)
        asker = agent_client(token)
    elif column == "no permission":
        assert endpoint.act is not None or endpoint.ok == 200
        lacking = user_without(endpoint.act or "answer questions")
        # Its own lease, taken while it still had the right: the lease alone is not enough.
        lacking.user_permissions.add(*permission_objects(permissions.DRIVE))
        asker = agent_client(issue(name="lacking", user=lacking, answers=person)[1])
        if endpoint.lease and endpoint.name != "api_next":
            holder, driver = asker, "lacking"
    elif column == "not its task":  # every permission, but the task is another agent's
        asker = agent_client(issue(name="stranger", user=dad)[1])
    elif column == "not a person":  # every permission, and the task is its own: still an agent
        asker = holder
    else:  # other lease: another agent, with every permission, and the holder's lease token
        asker = agent_client(issue(name="helper", user=dad)[1])

    world = build_world(holder, driver, file_root)
    if column == "no permission":
        revoke_drive = endpoint.act == "drive a step"
        lacking = User.objects.get(username="nobody-for-this")
        if revoke_drive:
            lacking.user_permissions.remove(*permission_objects(permissions.DRIVE))
    before = snapshot()
    receipts = Receipt.objects.count()
    refused = Event.objects.filter(kind=EventKind.DECISION_REFUSED).count()
    path, body = endpoint.request(world)
    response = asker.get(path) if endpoint.method == "GET" else post(asker, path, body)

    if column == "allowed" or endpoint.public or (column == "no permission" and not endpoint.act):
        assert response.status_code == endpoint.ok, response.content
        if column == "no permission":
            assert snapshot() == before  # a read changes nothing
        elif endpoint.method == "POST":
            assert snapshot() != before  # the same request with the right does something
        return
    answer = response.json()
    assert set(answer) >= {"detail", "error"}, answer
    if column in ("anonymous", "wrong token", "revoked", "expired"):
        assert response.status_code == 401, answer
        assert response["WWW-Authenticate"].startswith("Bearer")
        assert Receipt.objects.count() == receipts  # not even a receipt
        assert Event.objects.filter(kind=EventKind.DECISION_REFUSED).count() == refused
    elif column == "no permission":
        assert response.status_code == 403, answer
        assert answer["action"] == endpoint.act
        assert answer["missing"] == list(permissions.NEEDS[endpoint.act or ""])
        assert answer["detail"] == f"you may not {endpoint.act} ({', '.join(answer['missing'])})"
        [event] = Event.objects.filter(kind=EventKind.DECISION_REFUSED).order_by("pk")[refused:]
        assert event.actor == "agent:lacking" and event.data["action"] == endpoint.act
    elif column == "not a person":
        assert response.status_code == 403, answer
        assert answer["detail"].startswith(f"only a person may {endpoint.act}: agent 'pippa'")
    else:  # another agent's task (its lease, or simply not its own)
        assert response.status_code == 403, answer
        asking = "helper" if column == "other lease" else "stranger"
        assert f"is not agent '{asking}''s to" in answer["detail"], answer
        assert "an agent acts only on the tasks it created or a person gave it" in answer["detail"]
    assert snapshot() == before
    assert not (world.file_root / "w.txt").exists()
