"""The HTTP API (DESIGN.md §7, §12, §13): an agent with a token creates and steers tasks, and
drives them itself with `next` … work … `commit`; every command replays its first answer."""

from __future__ import annotations

import hashlib
import io
import json
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import URLPattern
from django.utils import timezone

from loop import actions, plans
from loop.api import core
from loop.api.core import issue
from loop.api.site import routes
from loop.models import AgentToken, Effect, Event, EventKind, Receipt, Step, Task
from loop.permissions import SYSTEM
from pippa_site import urls as site_urls

from . import conftest
from .conftest import step
from .support.cuts import cut, post, sent_not_recorded
from .support.sinks import Receiver


def make_task(*steps: dict[str, Any], **fields: Any) -> Any:
    """A task of Dad's, given to the agent `pippa` (an agent drives only tasks it created or was
    given; pass driver="" for one it was not)."""
    return conftest.make_task(*steps, **{"driver": "pippa", **fields})


class Agent:
    """An outside agent speaking HTTP with its bearer token."""

    def __init__(self, token: str) -> None:
        self.token = token
        self.client = Client(HTTP_AUTHORIZATION=f"Bearer {token}")

    def get(self, path: str) -> Any:
        return self.client.get(path)

    def post(self, path: str, body: Any = None, *, key: str | None = None) -> Any:
        data = "" if body is None else json.dumps(body)
        headers = {"Idempotency-Key": key or uuid.uuid4().hex}
        return self.client.post(path, data, content_type="application/json", headers=headers)


@pytest.fixture
def pippa_agent(dad: User) -> Agent:
    _, token = issue(name="pippa", user=dad)
    return Agent(token)


@pytest.fixture
def helper_agent(dad: User) -> Agent:
    """A second agent with Dad's permissions."""
    _, token = issue(name="helper", user=dad)
    return Agent(token)


@pytest.fixture
def guest_agent(guest: User) -> Agent:
    _, token = issue(name="visitor", user=guest)
    return Agent(token)


def plan(*steps: dict[str, Any], title: str = "api task") -> dict[str, Any]:
    return {"title": title, "steps": list(steps) or [step("a"), step("b")]}


def events(kind: str, **where: Any) -> list[Event]:
    return list(Event.objects.filter(kind=kind, **where))


# ---- tokens ------------------------------------------------------------------------------------


def test_the_database_keeps_only_the_tokens_digest(dad: User) -> None:
    out = io.StringIO()
    call_command("agent_token", "pippa", user="dad", stdout=out)
    token = out.getvalue().strip()
    row = AgentToken.objects.get(name="pippa")
    assert row.digest == hashlib.sha256(token.encode()).hexdigest()
    assert row.prefix == token[:8]
    stored = [str(v) for v in AgentToken.objects.values_list().get(pk=row.pk)]
    assert not any(token in value for value in stored)
    assert Agent(token).get("/api/tasks").status_code == 200
    assert AgentToken.objects.get(pk=row.pk).last_used_at is not None


def test_a_revoked_token_no_longer_opens_the_api(dad: User) -> None:
    out = io.StringIO()
    call_command("agent_token", "pippa", user="dad", stdout=out)
    agent = Agent(out.getvalue().strip())
    call_command("agent_token", "--revoke", "pippa", stdout=io.StringIO())
    response = agent.get("/api/tasks")
    assert response.status_code == 401
    assert "Authorization" in response.json()["error"]
    with pytest.raises(CommandError, match="no live token"):
        call_command("agent_token", "--revoke", "pippa")
    again = io.StringIO()
    call_command("agent_token", "pippa", user="dad", stdout=again)  # the name's new token
    assert Agent(again.getvalue().strip()).get("/api/tasks").status_code == 200
    assert agent.get("/api/tasks").status_code == 401


def test_a_token_for_an_unknown_user_is_refused(db: None) -> None:
    with pytest.raises(CommandError, match="--user: no user 'nobody'"):
        call_command("agent_token", "pippa", user="nobody")


def test_no_token_or_a_wrong_one_gets_401(pippa_agent: Agent) -> None:
    assert Client().get("/api/tasks").status_code == 401
    assert Agent("not-a-token").get("/api/tasks").status_code == 401
    bad = Client(HTTP_AUTHORIZATION=f"Basic {pippa_agent.token}").get("/api/tasks")
    assert bad.status_code == 401
    said = "Authorization: a valid 'Bearer <token>' header is required"
    assert bad.json() == {"detail": said, "error": said}


def test_a_browser_session_does_not_open_the_api(dad: User) -> None:
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(dad)
    assert browser.get("/api/tasks").status_code == 401
    created = browser.post(
        "/api/tasks", json.dumps(plan()), "application/json", headers={"Idempotency-Key": "k1"}
    )
    assert created.status_code == 401
    assert not Task.objects.exists()


# ---- tasks and plans ---------------------------------------------------------------------------


def test_an_agent_creates_a_task_from_a_plan(pippa_agent: Agent) -> None:
    response = pippa_agent.post("/api/tasks", plan())
    assert response.status_code == 201
    body = response.json()
    assert body["state"] == "running"
    assert [s["key"] for s in body["steps"]] == ["a", "b"]
    assert Task.objects.get(pk=body["id"]).created_by == "agent:pippa"
    assert pippa_agent.get(f"/api/tasks/{body['id']}").json() == body
    assert pippa_agent.get("/api/tasks").json() == [
        {"id": body["id"], "title": "api task", "state": "running"}
    ]


def test_a_bad_plan_is_a_400_naming_the_field_and_creates_nothing(pippa_agent: Agent) -> None:
    response = pippa_agent.post("/api/tasks", plan(step("a", tool="no.such.tool")))
    assert response.status_code == 400
    assert "step 'a'" in response.json()["error"]
    assert "tool" in response.json()["error"]
    not_json = pippa_agent.client.post(
        "/api/tasks", "{oops", content_type="application/json", headers={"Idempotency-Key": "x"}
    )
    assert not_json.status_code == 400
    assert not_json.json()["error"].startswith("body: not valid JSON")
    assert not Task.objects.exists()
    assert not Step.objects.exists()


def test_unknown_tasks_are_404_and_other_methods_405(pippa_agent: Agent) -> None:
    assert pippa_agent.get("/api/tasks/999").status_code == 404
    said = "task: no task 999"
    assert pippa_agent.post("/api/tasks/999/pause").json() == {"detail": said, "error": said}
    wrong = pippa_agent.get("/api/tasks/1/pause")
    assert wrong.status_code == 405
    assert wrong["Allow"] == "POST"
    assert pippa_agent.client.delete("/api/tasks").status_code == 405


def test_an_agent_adds_steps_pauses_resumes_and_supersedes(pippa_agent: Agent) -> None:
    task = make_task(step("a"), step("c"))
    added = pippa_agent.post(f"/api/tasks/{task.pk}/steps", {"steps": [step("b")], "after": "a"})
    assert added.status_code == 200
    assert [s["key"] for s in added.json()["steps"]] == ["a", "b", "c"]
    clash = pippa_agent.post(f"/api/tasks/{task.pk}/steps", {"steps": [step("b")]})
    assert clash.status_code == 400
    assert clash.json()["error"].startswith("step 'b': key")
    assert pippa_agent.post(f"/api/tasks/{task.pk}/pause").json()["state"] == "paused"
    assert pippa_agent.post(f"/api/tasks/{task.pk}/pause").status_code == 409
    assert pippa_agent.post(f"/api/tasks/{task.pk}/resume").json()["state"] == "running"
    successor = pippa_agent.post(f"/api/tasks/{task.pk}/supersede", plan(title="better"))
    assert successor.status_code == 201
    assert successor.json()["title"] == "better"
    old = pippa_agent.get(f"/api/tasks/{task.pk}").json()
    assert old["state"] == "superseded"
    assert old["successor"] == successor.json()["id"]


# ---- command receipts --------------------------------------------------------------------------


def test_a_post_without_an_idempotency_key_is_a_400(pippa_agent: Agent) -> None:
    response = pippa_agent.client.post("/api/tasks", json.dumps(plan()), "application/json")
    assert response.status_code == 400
    assert response.json()["error"].startswith("Idempotency-Key:")
    assert not Task.objects.exists()


def test_a_replayed_command_answers_the_same_and_does_nothing_twice(pippa_agent: Agent) -> None:
    task = make_task(step("a"))
    first = pippa_agent.post(f"/api/tasks/{task.pk}/pause", key="pause-1")
    pippa_agent.post(f"/api/tasks/{task.pk}/resume")
    again = pippa_agent.post(f"/api/tasks/{task.pk}/pause", key="pause-1")
    assert again.status_code == first.status_code == 200
    assert again.json() == first.json()
    assert again["Idempotent-Replayed"] == "true"
    assert Task.objects.get(pk=task.pk).state == "running"  # the replay paused nothing
    pauses = [e for e in events(EventKind.TASK_STATE, task=task) if e.data.get("new") == "paused"]
    assert len(pauses) == 1


def test_a_replayed_create_makes_one_task(pippa_agent: Agent) -> None:
    first = pippa_agent.post("/api/tasks", plan(), key="create-1")
    again = pippa_agent.post("/api/tasks", plan(), key="create-1")
    assert again.status_code == 201
    assert again.json()["id"] == first.json()["id"]
    assert Task.objects.count() == 1


def test_a_refused_command_keeps_its_receipt(pippa_agent: Agent) -> None:
    task = make_task(step("a"))
    refused = pippa_agent.post(f"/api/tasks/{task.pk}/resume", key="resume-1")  # not paused
    assert refused.status_code == 409
    pippa_agent.post(f"/api/tasks/{task.pk}/pause")
    # The refusal replays as a refusal: it cannot resume the newer pause.
    assert pippa_agent.post(f"/api/tasks/{task.pk}/resume", key="resume-1").json() == refused.json()
    assert Task.objects.get(pk=task.pk).state == "paused"
    assert Receipt.objects.get(command_id="resume-1").status == 409


def test_a_command_id_reused_with_another_body_or_path_is_a_409(pippa_agent: Agent) -> None:
    one, two = make_task(step("a")), make_task(step("a"))
    assert pippa_agent.post("/api/tasks", plan(title="one"), key="k").status_code == 201
    other_body = pippa_agent.post("/api/tasks", plan(title="two"), key="k")
    assert other_body.status_code == 409
    assert "another body" in other_body.json()["error"]
    assert pippa_agent.post(f"/api/tasks/{one.pk}/pause", key="p").status_code == 200
    other_task = pippa_agent.post(f"/api/tasks/{two.pk}/pause", key="p")
    assert other_task.status_code == 409
    assert f"POST /api/tasks/{one.pk}/pause" in other_task.json()["error"]
    assert Task.objects.get(pk=two.pk).state == "running"
    assert Task.objects.count() == 3


def test_a_concurrent_duplicate_is_rolled_back_and_answered_as_the_first(
    pippa_agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    task = make_task(step("a"))
    first = pippa_agent.post(f"/api/tasks/{task.pk}/pause", key="twice")
    pippa_agent.post(f"/api/tasks/{task.pk}/resume")
    looked: list[str] = []

    def too_early(call: Any) -> Any:
        """The duplicate looked for a receipt before the first request had committed its own."""
        looked.append(call.command_id)
        return None if len(looked) == 1 else replay(call)

    replay = core.replay
    monkeypatch.setattr(core, "replay", too_early)
    again = pippa_agent.post(f"/api/tasks/{task.pk}/pause", key="twice")
    assert again.json() == first.json()
    assert Task.objects.get(pk=task.pk).state == "running"  # its pause went with its receipt
    assert Receipt.objects.filter(command_id="twice").count() == 1


def test_command_ids_belong_to_their_agent(pippa_agent: Agent, helper_agent: Agent) -> None:
    mine, theirs = make_task(step("a")), make_task(step("a"), driver="helper")
    assert pippa_agent.post(f"/api/tasks/{mine.pk}/pause", key="same").status_code == 200
    # Another agent's same key is its own command: it runs on its own task.
    paused = helper_agent.post(f"/api/tasks/{theirs.pk}/pause", key="same")
    assert paused.status_code == 200 and paused.json()["id"] == theirs.pk


# ---- next and commit ---------------------------------------------------------------------------


def test_an_agent_runs_a_task_with_next_and_commit(pippa_agent: Agent) -> None:
    task = make_task(step("a"), step("b"))
    for key in ("a", "b"):
        taken = pippa_agent.post(f"/api/tasks/{task.pk}/next")
        assert taken.status_code == 200
        body = taken.json()
        assert body["step"]["key"] == key
        assert body["step"]["state"] == "running"
        assert body["step"]["attempts"] == 1
        done = pippa_agent.post(
            f"/api/steps/{body['step']['id']}/commit",
            {"lease_token": body["lease_token"], "verdict": "done", "output": {"said": key}},
        )
        assert done.status_code == 200
        assert done.json()["step"]["state"] == "done"
        assert done.json()["step"]["output"] == {"said": key}
    assert Task.objects.get(pk=task.pk).state == "done"
    assert events(EventKind.STEP_STARTED, task=task)[0].actor == "agent:pippa"
    nothing = pippa_agent.post(f"/api/tasks/{task.pk}/next")
    assert nothing.status_code == 409
    assert nothing.json()["error"] == f"state: task {task.pk} is done, not running"


def test_a_blocked_verdict_needs_an_uncertain_effect_to_ask_about(pippa_agent: Agent) -> None:
    task = make_task(step("a"))
    body = pippa_agent.post(f"/api/tasks/{task.pk}/next").json()
    refused = pippa_agent.post(
        f"/api/steps/{body['step']['id']}/commit",
        {"lease_token": body["lease_token"], "verdict": "blocked"},
    )
    assert refused.status_code == 409
    assert refused.json()["error"].startswith("verdict:")
    assert Step.objects.get(task=task).state == "running"


def test_next_holds_the_lease_against_workers_and_other_agents(
    pippa_agent: Agent, helper_agent: Agent, worker: Any
) -> None:
    task = make_task(step("a"))
    taken = pippa_agent.post(f"/api/tasks/{task.pk}/next").json()
    held = Task.objects.get(pk=task.pk)
    assert held.lease_owner == -AgentToken.objects.get(name="pippa").pk
    assert worker.tick() is False  # the worker finds nothing to claim
    renewed = pippa_agent.post(
        f"/api/steps/{taken['step']['id']}/renew", {"lease_token": taken["lease_token"]}
    )
    assert renewed.status_code == 200
    actions.give(task_id=task.pk, agent="helper", actor="dad", user=SYSTEM)  # Dad gives it on
    other = helper_agent.post(f"/api/tasks/{task.pk}/next")
    assert other.status_code == 409  # pippa still holds its lease
    assert other.json()["error"].startswith(f"lease: task {task.pk} is held by agent:pippa")
    assert Step.objects.get(pk=taken["step"]["id"]).state == "running"


def test_a_stale_lease_token_is_refused_and_journaled_as_late(pippa_agent: Agent) -> None:
    task = make_task(step("a"))
    first = pippa_agent.post(f"/api/tasks/{task.pk}/next").json()
    second = pippa_agent.post(f"/api/tasks/{task.pk}/next").json()  # claimed again: new epoch
    assert second["step"]["attempts"] == 2
    step_id = first["step"]["id"]
    late = pippa_agent.post(
        f"/api/steps/{step_id}/commit", {"lease_token": first["lease_token"], "verdict": "done"}
    )
    assert late.status_code == 409
    assert "late_result" in late.json()["error"]
    assert [e.data["verdict"] for e in events(EventKind.LATE_RESULT, step_id=step_id)] == ["done"]
    assert Step.objects.get(pk=step_id).state == "running"
    on_time = pippa_agent.post(
        f"/api/steps/{step_id}/commit", {"lease_token": second["lease_token"], "verdict": "done"}
    )
    assert on_time.status_code == 200


def test_a_worker_takes_over_a_lapsed_agent_lease_and_the_agent_is_late(
    pippa_agent: Agent, worker: Any
) -> None:
    task = make_task(step("a"))
    taken = pippa_agent.post(f"/api/tasks/{task.pk}/next").json()
    Task.objects.filter(pk=task.pk).update(lease_until=timezone.now() - timedelta(seconds=1))
    assert worker.tick() is True  # the agent went quiet: its step is re-entered and run
    assert Step.objects.get(pk=taken["step"]["id"]).attempts == 2
    late = pippa_agent.post(
        f"/api/steps/{taken['step']['id']}/commit",
        {"lease_token": taken["lease_token"], "verdict": "failed", "error": "too slow"},
    )
    assert late.status_code == 409
    assert Step.objects.get(pk=taken["step"]["id"]).state == "done"
    assert len(events(EventKind.LATE_RESULT, task=task)) == 1


def test_a_lease_token_is_checked(pippa_agent: Agent, helper_agent: Agent) -> None:
    task = make_task(step("a"), step("b"))
    taken = pippa_agent.post(f"/api/tasks/{task.pk}/next").json()
    other_step = Step.objects.get(task=task, key="b").pk
    wrong_step = pippa_agent.post(
        f"/api/steps/{other_step}/commit", {"lease_token": taken["lease_token"], "verdict": "done"}
    )
    assert wrong_step.status_code == 400
    assert wrong_step.json()["error"].startswith("lease_token: is for step")
    step_id = taken["step"]["id"]
    forged = pippa_agent.post(
        f"/api/steps/{step_id}/commit", {"lease_token": "x:y:z", "verdict": "done"}
    )
    assert forged.status_code == 403
    not_theirs = helper_agent.post(
        f"/api/steps/{step_id}/commit", {"lease_token": taken["lease_token"], "verdict": "done"}
    )
    assert not_theirs.status_code == 403
    bad_verdict = pippa_agent.post(
        f"/api/steps/{step_id}/commit", {"lease_token": taken["lease_token"], "verdict": "meh"}
    )
    assert bad_verdict.status_code == 400
    assert bad_verdict.json()["error"].startswith("verdict:")
    assert Step.objects.get(pk=step_id).state == "running"


def test_a_retry_verdict_makes_next_wait(pippa_agent: Agent) -> None:
    task = make_task(step("a"))
    taken = pippa_agent.post(f"/api/tasks/{task.pk}/next").json()
    retry = pippa_agent.post(
        f"/api/steps/{taken['step']['id']}/commit",
        {"lease_token": taken["lease_token"], "verdict": "retry", "error": "busy", "delay": 60},
    )
    assert retry.status_code == 200
    waiting = pippa_agent.post(f"/api/tasks/{task.pk}/next")
    assert waiting.status_code == 409
    assert waiting.json()["error"].startswith("run_after:")


def pay_after_asking() -> Task:
    return make_task(
        step(
            "pay",
            tool="file.write",
            args={"path": "p.txt", "content": "x"},
            side_effect=True,
            confirm_before=True,
        )
    )


def test_next_on_a_step_that_must_ask_answers_no_step(pippa_agent: Agent) -> None:
    task = pay_after_asking()
    answer = pippa_agent.post(f"/api/tasks/{task.pk}/next")
    assert answer.status_code == 200
    body = answer.json()
    assert body["step"] is None
    assert body["task"]["state"] == "blocked"
    assert body["task"]["steps"][0]["question"]["kind"] == "may_i"
    # The agent keeps the task while Dad is asked: once he answers, it is the agent's to run.
    assert Task.objects.get(pk=task.pk).lease_owner == -AgentToken.objects.get(name="pippa").pk


# ---- answers -----------------------------------------------------------------------------------


def asking(agent: Agent) -> Step:
    task = pay_after_asking()
    agent.post(f"/api/tasks/{task.pk}/next")
    return Step.objects.get(task=task)


def test_unblock_without_permission_is_403_and_journaled(
    pippa_agent: Agent, guest_agent: Agent
) -> None:
    pay = asking(pippa_agent)
    refused = guest_agent.post(f"/api/steps/{pay.pk}/unblock", {"decision": "allow"})
    assert refused.status_code == 403
    answer = refused.json()
    assert answer["detail"] == "you may not answer questions (loop.confirm_step)"
    assert answer["action"] == "answer questions" and answer["missing"] == ["loop.confirm_step"]
    [event] = events(EventKind.DECISION_REFUSED, step=pay)
    assert event.actor == "agent:visitor"
    assert Step.objects.get(pk=pay.pk).state == "blocked"


def test_a_persons_client_answers_a_question_and_an_agent_never_does(
    pippa_agent: Agent, dad: User
) -> None:
    pay = asking(pippa_agent)
    refused = pippa_agent.post(f"/api/steps/{pay.pk}/unblock", {"decision": "allow"})
    assert refused.status_code == 403  # Dad's permissions, not his voice
    assert refused.json()["detail"].startswith("only a person may answer questions")
    phone = Agent(issue(name="dads-phone", user=dad, answers=True)[1])
    wrong = phone.post(f"/api/steps/{pay.pk}/unblock", {"decision": "happened"})
    assert wrong.status_code == 409
    bad = phone.post(f"/api/steps/{pay.pk}/unblock", {"decision": "maybe"})
    assert bad.status_code == 400
    assert bad.json()["error"].startswith("decision:")
    allowed = phone.post(f"/api/steps/{pay.pk}/unblock", {"decision": "allow", "note": "ok"})
    assert allowed.status_code == 200
    assert allowed.json()["state"] == "pending"
    [decision] = events(EventKind.DECISION, step=pay)
    assert decision.actor == "agent:dads-phone"
    assert pippa_agent.post(f"/api/tasks/{pay.task_id}/next").json()["step"]["key"] == "pay"


# ---- effects -----------------------------------------------------------------------------------


def test_an_agents_side_effect_goes_through_the_outbox_once(
    pippa_agent: Agent, file_root: Path
) -> None:
    task = make_task(
        step("save", tool="file.write", args={"path": "a.txt", "content": "hi"}, side_effect=True)
    )
    taken = pippa_agent.post(f"/api/tasks/{task.pk}/next").json()
    call = {
        "lease_token": taken["lease_token"],
        "step": taken["step"]["id"],
        "tool": "file.write",
        "args": {"path": "a.txt", "content": "hi"},
    }
    first = pippa_agent.post("/api/effects", call)
    assert first.status_code == 200
    assert first.json()["output"]["path"].endswith("a.txt")
    again = pippa_agent.post("/api/effects", call)  # a new command id: the outbox's receipt
    assert again.json() == first.json()
    effect = Effect.objects.get(pk=first.json()["effect"])
    assert (effect.state, effect.sends) == ("succeeded", 1)
    assert len(events(EventKind.RECEIPT_HIT, effect=effect)) == 1
    read_only = make_task(step("look"))
    look = pippa_agent.post(f"/api/tasks/{read_only.pk}/next").json()
    refused = pippa_agent.post(
        "/api/effects", {**call, "lease_token": look["lease_token"], "step": look["step"]["id"]}
    )
    assert refused.status_code == 400
    assert refused.json()["error"].startswith("step: 'look' is read-only")


def test_an_effect_the_receiver_refused_for_now_says_when_to_try_again(
    pippa_agent: Agent,
) -> None:
    with Receiver() as sink:
        sink.behave("429")
        url = sink.url("/hook")
        task = make_task(step("post", tool="http.post", args={"url": url}, side_effect=True))
        taken = pippa_agent.post(f"/api/tasks/{task.pk}/next").json()
        call = {
            "lease_token": taken["lease_token"],
            "step": taken["step"]["id"],
            "tool": "http.post",
            "args": {"url": url},
        }
        later = pippa_agent.post("/api/effects", call)
    assert later.status_code == 503
    assert later["Retry-After"] == "7" and later.json()["retry_after"] == 7
    assert Effect.objects.get(pk=later.json()["effect"]).state == "pending"  # never sent


def test_next_probes_a_cut_effect_and_the_agent_gets_its_receipt(
    pippa_agent: Agent, settings: Any
) -> None:
    with Receiver() as receiver:
        settings.LOOP_HTTP_PROBE_URL = receiver.probe_url
        task = make_task(post(receiver.url()))
        cut(task, sent_not_recorded)  # a worker sent the POST and died before recording it
        taken = pippa_agent.post(f"/api/tasks/{task.pk}/next", key="after-cut")
        body = taken.json()
        assert body["step"]["key"] == "pay"  # the probe found it happened: no question
        assert [e.data["found"] for e in events(EventKind.PROBE, task=task)] == [True]
        call = {"lease_token": body["lease_token"], "step": body["step"]["id"], "tool": "http.post"}
        paid = pippa_agent.post("/api/effects", {**call, "args": body["step"]["args"]})
        assert paid.status_code == 200
        assert len(receiver.posts) == 1  # answered from the receipt, never sent again
    replayed = pippa_agent.post(f"/api/tasks/{task.pk}/next", key="after-cut")
    assert replayed.json() == body


# ---- the journal and the document ----------------------------------------------------------------


def test_events_page_after_an_id(pippa_agent: Agent) -> None:
    make_task(step("a"))
    first = pippa_agent.get("/api/events").json()
    assert [e["id"] for e in first["events"]] == sorted(e["id"] for e in first["events"])
    assert first["events"][0]["kind"] == "task_created"
    assert first["last"] == first["events"][-1]["id"]
    assert pippa_agent.get(f"/api/events?after={first['last']}").json() == {
        "events": [],
        "last": first["last"],
    }
    make_task(step("b"))
    later = pippa_agent.get(f"/api/events?after={first['last']}").json()
    assert later["events"] and all(e["id"] > first["last"] for e in later["events"])
    bad = pippa_agent.get("/api/events?after=yesterday")
    assert bad.status_code == 400
    assert bad.json()["error"].startswith("after:")


def test_the_openapi_document_describes_every_api_route(db: None) -> None:
    """Every URL served under /api/ is in the document with its methods; every POST that reads
    a body has its schema (the fields the server accepts, no others); every answer the server
    may give has its schema, an error's being `Error`."""
    doc = Client().get("/api/openapi.json").json()
    assert doc["openapi"].startswith("3.1")
    schemas = doc["components"]["schemas"]

    def resolved(schema: dict[str, Any]) -> dict[str, Any]:
        for option in schema.get("anyOf", []):  # an optional body: the schema or null
            if option.get("type") != "null":
                schema = option
        ref = schema.get("$ref", "")
        return schemas[ref.rsplit("/", 1)[-1]] if ref else schema

    served = {
        "/" + str(p.pattern).replace("<int:", "{").replace(">", "}")
        for p in site_urls.urlpatterns
        if isinstance(p, URLPattern) and str(p.pattern).startswith("api/")
    }
    listed: dict[str, set[str]] = {}
    for path, method, _ in routes():
        listed.setdefault(path, set()).add(method.lower())
    assert len(served) >= 13 and served == set(listed) == set(doc["paths"])
    bodies = {}
    for path, methods in listed.items():
        assert set(doc["paths"][path]) == methods, path
        for method in methods:
            operation = doc["paths"][path][method]
            for status, answer in operation["responses"].items():
                schema = answer["content"]["application/json"]["schema"]
                if int(status) >= 400:
                    assert schema == {"$ref": "#/components/schemas/Error"}, (path, status)
                else:
                    assert schema, (path, status)
            if method == "post":
                body = resolved(operation["requestBody"]["content"]["application/json"]["schema"])
                assert body["type"] == "object" and body["additionalProperties"] is False, path
                bodies[path] = (set(body.get("properties", {})), set(body.get("required", [])))
    assert bodies["/api/steps/{step_id}/commit"] == (
        {"lease_token", "verdict", "output", "error", "delay", "release"},
        {"lease_token", "verdict"},
    )
    assert bodies["/api/effects"] == (
        {"lease_token", "step", "tool", "args", "key"},
        {"lease_token", "step", "tool"},
    )
    # a plan, or a goal in words (DESIGN.md §12): one of the two
    assert bodies["/api/tasks"] == (plans.PLAN_FIELDS - {"schedule", "timezone"} | {"goal"}, set())
    assert resolved(
        doc["paths"]["/api/tasks"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    )["anyOf"] == [{"required": ["title", "steps"]}, {"required": ["goal"]}]
    assert bodies["/api/schedules"] == (plans.PLAN_FIELDS, {"title", "schedule", "steps"})
    assert bodies["/api/tasks/{task_id}/pause"] == (set(), set())
    step_schema = schemas["PlanStep"]
    assert set(step_schema["properties"]) == plans.STEP_FIELDS
    assert set(step_schema["required"]) == {"key"}
    commit = doc["paths"]["/api/steps/{step_id}/commit"]["post"]["responses"]["200"]
    answer = resolved(commit["content"]["application/json"]["schema"])
    assert set(answer["required"]) == {"step", "task", "lease_until"}
    task = resolved(doc["paths"]["/api/tasks/{task_id}"]["get"]["responses"]["200"]["content"]["application/json"]["schema"])  # fmt: skip
    assert {"id", "title", "state", "steps", "events", "origin"} <= set(task["properties"])


def test_a_field_the_document_does_not_name_is_refused_naming_it(pippa_agent: Agent) -> None:
    """The bodies' `additionalProperties: false` is what the server does."""
    task = make_task(step("a"))
    for path in (f"/api/tasks/{task.pk}/pause", f"/api/tasks/{task.pk}/steps", "/api/effects"):
        refused = pippa_agent.post(path, {"steps": [], "surprise": 1})
        assert refused.status_code == 400, refused.content
        assert "surprise: unknown field" in refused.json()["errors"]
    assert Task.objects.get(pk=task.pk).state == "running"


def test_the_admin_lists_tokens_without_their_digest(dad: User) -> None:
    agent, _ = issue(name="pippa", user=dad)
    staff = Client()
    staff.force_login(User.objects.create_superuser("root", password="root-password-1"))
    listed = staff.get("/admin/loop/agenttoken/")
    shown = staff.get(f"/admin/loop/agenttoken/{agent.pk}/change/")
    assert listed.status_code == shown.status_code == 200
    assert agent.prefix in listed.content.decode()
    assert agent.digest not in listed.content.decode() + shown.content.decode()


def test_an_id_past_the_database_range_is_a_404(pippa_agent: Agent) -> None:
    huge = 2**63  # one past the largest id a column holds: the database would refuse it
    shown = pippa_agent.get(f"/api/tasks/{huge}")
    assert shown.status_code == 404 and shown.json()["error"] == f"task: no task {huge}"
    claimed = pippa_agent.post(f"/api/tasks/{huge}/next")
    assert claimed.status_code == 404
    assert pippa_agent.post(f"/api/steps/{huge}/renew", {"lease_token": "x"}).status_code == 404


def test_a_decision_of_the_wrong_type_is_a_400(pippa_agent: Agent) -> None:
    pay = asking(pippa_agent)
    for decision in ({"allow": True}, ["allow"], 1, None):
        bad = pippa_agent.post(f"/api/steps/{pay.pk}/unblock", {"decision": decision})
        assert bad.status_code == 400 and bad.json()["error"].startswith("decision:")
    assert Step.objects.get(pk=pay.pk).state == "blocked"


def test_an_idempotency_key_with_unprintable_characters_is_a_400(pippa_agent: Agent) -> None:
    refused = pippa_agent.post("/api/tasks", plan(), key="bad\u0001key")
    assert refused.status_code == 400
    assert refused.json()["detail"] == "Idempotency-Key: printable characters only"
    assert not Task.objects.exists()
