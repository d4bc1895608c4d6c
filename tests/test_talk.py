"""Dad and Pippa talk (DESIGN.md §10, §17), through one real `runloop` process and the scripted
model server, whose log of requests is the proof of what Pippa was shown:

- a message Dad writes while a model step runs is in that step's next request;
- a message no running task answers starts a conversation turn: Pippa replies with `say` and
  proposes a task; Dad approves it with one click; it runs;
- "no watering please", then the schedule's next run: Pippa, told, skips, and the valve
  receiver gets nothing.
"""

from __future__ import annotations

import json
import subprocess
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from loop import actions, conversation, goals, plans, schedules, transcript, turns
from loop.models import AuthorKind, Message, Schedule, Task, TaskState
from loop.permissions import SYSTEM

from .conftest import kill, make_task, manage, model_env, start_runloop, wait_for
from .support.llm_server import ModelServer, briefings, call, calls, commit, tool_results
from .support.sinks import Receiver

pytestmark = pytest.mark.django_db(transaction=True)


def step_key(body: dict[str, Any]) -> str:
    for text in reversed(briefings(body["messages"])):
        for line in text.splitlines():
            if line.startswith("Your step now: "):
                return line.removeprefix("Your step now: ").split(":")[0]
    raise AssertionError("no briefing")


def shown(body: dict[str, Any]) -> str:
    """What the request carries besides the transcript (`prompt.context`): "" if nothing."""
    messages = body["messages"]
    if len(messages) > 1 and messages[1]["role"] == "system":
        return str(messages[1]["content"])
    return ""


def test_pippa_reads_and_writes_the_conversation_through_a_real_runloop(
    dad: Any, tmp_path: Path, processes: list[subprocess.Popen[bytes]], settings: Any
) -> None:
    with Receiver() as valve:
        env: dict[str, str] = {}
        killed: list[bool] = []

        def script(body: dict[str, Any], n: int) -> Any:
            key, done = step_key(body), tool_results(body["messages"])
            if key == "think":  # Dad writes while this step runs
                if not done:
                    manage("say", "Use the red bucket.", "--as", "dad", env=env)
                    return call("echo", value="thinking")
                return commit(output="red" if "Use the red bucket." in shown(body) else "?")
            if key == turns.TURN_KEY:
                if not done:
                    plan = {
                        "title": "Fill the bucket",
                        "steps": [{"key": "fill", "tool": "echo", "args": {"value": 1}}],
                    }
                    return calls(
                        ("say", {"text": "No watering today. Shall I fill the bucket instead?"}),
                        ("propose_task", plan),
                    )
                if not killed:  # the worker dies before the turn commits: a cut turn
                    killed.append(True)
                    return lambda: (kill(processes[-1]), commit(output="lost"))[1]
                return commit(output="answered")
            if key == "water":
                if "no watering please" in shown(body):
                    return commit(output="skipped: Dad said no watering")
                return call("http_post", url=valve.url("/open"))
            raise AssertionError(f"unexpected step {key}")

        with ModelServer(script) as model:
            settings.LOOP_LLM_BASE_URL = model.base_url
            env.update(model_env(model))
            think = make_task({"key": "think", "judge": "model", "instructions": "Think."})
            processes.append(start_runloop(env=env, log=tmp_path / "runloop.log"))

            # 1. Written mid-step: the step's next request carries it.
            wait_for(lambda: Task.objects.get(pk=think.pk).state == TaskState.DONE, timeout=90)
            assert think.steps.get().output == "red"
            first, second = [b for b in model.requests if step_key(b) == "think"]
            assert "Use the red bucket." not in json.dumps(first["messages"])
            assert "- " in shown(second) and "Dad (dad): Use the red bucket." in shown(second)
            assert "outrank" in shown(second)  # Dad's words outrank the plan

            # 2. A message no running task answers: a turn, a reply, a proposal, one click.
            message, turn = turns.post(author="dad", text="no watering please", user=dad)
            assert turn is not None and turn.origin_message_id == message.pk
            wait_for(lambda: bool(killed) and processes[-1].poll() is not None, timeout=60)
            processes.append(start_runloop(env=env, log=tmp_path / "runloop2.log"))
            wait_for(lambda: Task.objects.get(pk=turn.pk).state == TaskState.DONE, timeout=60)
            assert turn.steps.get().output == "answered"  # the cut turn, answered once
            said = Message.objects.filter(author_kind=AuthorKind.PIPPA).order_by("id")
            assert [m.text for m in said][0].startswith("No watering today.")
            proposed = said.last()
            assert proposed is not None and proposed.proposal is not None
            task = proposed.proposal
            assert goals.waits_for_approval(task)  # nothing runs before Dad's click
            actions.approve_plan(task_id=task.pk, actor="dad", user=dad)
            wait_for(lambda: Task.objects.get(pk=task.pk).state == TaskState.DONE, timeout=60)

            # 3. The schedule's next run: Pippa, told, skips; the valve gets nothing.
            spec = plans.validate(
                {
                    "title": "water",
                    "schedule": "0 6 * * *",
                    "timezone": "UTC",
                    "steps": [
                        {
                            "key": "water",
                            "judge": "model",
                            "instructions": "Open the valve with http_post.",
                            "tools": ["http.post"],
                            "side_effect": True,
                        }
                    ],
                }
            )
            schedule = schedules.create(spec=spec, actor="dad", user=SYSTEM)
            due = timezone.now() - timedelta(seconds=1)
            Schedule.objects.filter(pk=schedule.pk).update(next_due=due)
            wait_for(lambda: Task.objects.filter(origin_run__schedule=schedule).exists())
            run = Task.objects.get(origin_run__schedule=schedule)
            wait_for(lambda: Task.objects.get(pk=run.pk).state == TaskState.DONE, timeout=60)
            kill(processes[-1])
        assert valve.posts == []
    assert run.steps.get().output == "skipped: Dad said no watering"
    # The turn's step is durable and paired; its say and proposal each posted once.
    reply = turn.steps.get()
    assert transcript.unpaired(transcript.entries(reply)) == []
    assert Message.objects.filter(author_kind=AuthorKind.PIPPA).count() == 2
    assert conversation.message_dict(proposed)["proposal"] == task.pk


# ---- the three answers over the API and at the shell --------------------------------------------


@pytest.mark.django_db(transaction=False)
def test_the_api_and_the_shell_edit_deny_and_reply(dad: Any, worker: Any) -> None:
    """`POST /api/steps/{id}/unblock` with `args` (edit, then allow), a bad edit is a 400
    naming the field and changes nothing; `manage.py unblock --reply` keeps a tool step
    waiting; `--deny --note` fails it and its task waits, paused, not failed."""
    from django.core.management import CommandError, call_command

    from loop.api.core import issue
    from loop.models import Event, Step

    from .conftest import run_until_idle, step
    from .test_api import Agent

    url = "http://127.0.0.1:9/pay"
    pay = step("pay", "http.post", args={"url": url, "json": {"n": 1}}, confirm_before=True)
    task = make_task(pay, step("after"))
    run_until_idle(worker)
    asking = Step.objects.get(task=task, key="pay")
    phone = Agent(issue(name="dads-phone", user=dad, answers=True)[1])
    where = f"/api/steps/{asking.pk}/unblock"
    bad = phone.post(where, {"decision": "allow", "args": {"url": 5}})
    assert bad.status_code == 400 and "url" in bad.json()["error"], bad.content
    bad = phone.post(where, {"decision": "deny", "args": {"url": url}})
    assert bad.status_code == 400 and bad.json()["error"].startswith("args:"), bad.content
    assert phone.post(where, {"decision": "reply"}).status_code == 400  # a reply needs words
    asking.refresh_from_db()
    assert asking.state == "blocked" and asking.args["json"] == {"n": 1}

    call_command("unblock", str(asking.pk), "--reply", "Is this the plumber's bill?")
    asking.refresh_from_db()
    assert asking.state == "blocked"
    with pytest.raises(CommandError, match="args: not JSON"):
        call_command("unblock", str(asking.pk), "--allow", "--args", "{nope")
    edited = {"url": url, "json": {"n": 2}}
    done = phone.post(where, {"decision": "allow", "args": edited})
    assert done.status_code == 200 and done.json()["state"] == "pending", done.content
    asking.refresh_from_db()
    assert asking.args == edited and asking.authorized_by == "agent:dads-phone"
    [decision] = Event.objects.filter(step=asking, kind="decision", data__decision="allow")
    assert decision.data["edited"] == {"before": pay["args"], "after": edited}

    second = make_task(step("pay", "http.post", args={"url": url}, confirm_before=True))
    run_until_idle(worker)
    denied = Step.objects.get(task=second)
    call_command("unblock", str(denied.pk), "--deny", "--note", "Not this month.")
    denied.refresh_from_db()
    assert denied.state == "failed" and denied.error.endswith("Not this month.")
    assert Task.objects.get(pk=second.pk).state == TaskState.PAUSED  # waits, not failed


@pytest.mark.django_db(transaction=False)
def test_edit_then_allow_pippas_call_sends_the_edited_call_once(
    llm: Any, worker: Any, dad: Any
) -> None:
    """Dad edits the call Pippa asked about: the edited call goes out once (its effect the
    edited call's), the authorization binds it, her transcript keeps her call as she made it,
    and her next request is told of the edit."""
    from loop import calls
    from loop.models import Event, Step

    from .conftest import run_until_idle

    with Receiver() as sink:

        def script(body: dict[str, Any], n: int) -> Any:
            if not tool_results(body["messages"]):
                return call("http_post", url=sink.url("/pay"), json={"n": 1})
            assert '"n": 2' in shown(body) and "edited" in shown(body)
            return commit(output="paid as Dad said")

        llm(script)
        task = make_task(
            {
                "key": "pay",
                "judge": "model",
                "instructions": "Pay.",
                "tools": ["http.post"],
                "side_effect": True,
                "confirm_before": True,
            }
        )
        run_until_idle(worker)
        pay = Step.objects.get(task=task)
        assert pay.state == "blocked"
        edited = {"url": sink.url("/pay"), "json": {"n": 2}}
        with pytest.raises(plans.PlanError, match="url"):
            actions.unblock(
                step_id=pay.pk, decision="allow", actor="dad", user=dad, args={"url": 7}
            )
        actions.unblock(step_id=pay.pk, decision="allow", actor="dad", user=dad, args=edited)
        pay.refresh_from_db()
        assert pay.authorized_call == calls.digest("http.post", edited)
        run_until_idle(worker)
        pay.refresh_from_db()
        assert (pay.state, pay.output) == ("done", "paid as Dad said")
        assert [json.loads(p.body) for p in sink.posts] == [{"n": 2}]
    [made] = [e for e in transcript.entries(pay) if e.role == "assistant"][0].tool_calls
    assert json.loads(made["arguments"])["json"] == {"n": 1}  # her call, as she made it
    [decision] = Event.objects.filter(step=pay, kind="decision")
    assert decision.data["edited"]["after"] == edited


@pytest.mark.django_db(transaction=False)
def test_a_denied_tool_step_waits_and_pippa_is_told_why(llm: Any, worker: Any, dad: Any) -> None:
    """Deny, with a reason, on a tool step: it fails, the task waits (paused) instead of
    failing; resumed, Pippa's next step is told which step Dad denied and why."""
    from .conftest import run_until_idle, step

    told: list[str] = []

    def script(body: dict[str, Any], n: int) -> Any:
        told.append(shown(body))
        return commit(output="told")

    llm(script)
    url = "http://127.0.0.1:9/pay"
    task = make_task(
        step("pay", "http.post", args={"url": url}, confirm_before=True),
        {"key": "next", "judge": "model", "instructions": "Go on."},
    )
    run_until_idle(worker)
    pay = task.steps.get(key="pay")
    actions.unblock(step_id=pay.pk, decision="deny", actor="dad", user=dad, note="Too dear.")
    assert Task.objects.get(pk=task.pk).state == TaskState.PAUSED
    actions.resume(task_id=task.pk, actor="dad", user=dad)
    run_until_idle(worker)
    assert "about step 'pay': deny: Too dear." in told[0]
    assert Task.objects.get(pk=task.pk).state == TaskState.DONE


@pytest.mark.django_db(transaction=False)
def test_pippa_proposes_a_schedule_and_only_dads_click_makes_it(
    llm: Any, worker: Any, dad: Any, guest: Any
) -> None:
    from django.test import Client

    from .conftest import run_until_idle

    weekly = {
        "title": "Water the roses",
        "schedule": "0 6 * * MON",
        "timezone": "Europe/Berlin",
        "steps": [{"key": "water", "tool": "echo", "args": {"value": "roses"}}],
    }

    def script(body: dict[str, Any], n: int) -> Any:
        if not tool_results(body["messages"]):
            return calls(("propose_schedule", {**weekly, "schedule": "never"}))
        if len(tool_results(body["messages"])) == 1:
            assert "schedule" in tool_results(body["messages"])[0]  # refused, naming it
            return calls(("propose_schedule", weekly))
        return commit(output="proposed")

    llm(script)
    message, turn = turns.post(author="dad", text="Water the roses every Monday.", user=dad)
    assert turn is not None
    run_until_idle(worker)
    proposal = Message.objects.get(proposed_schedule__isnull=False)
    assert proposal.author_kind == AuthorKind.PIPPA and proposal.proposed_schedule == weekly
    assert not Schedule.objects.exists()  # nothing before Dad's click
    where = f"/conversation/{proposal.pk}/schedule"
    outsider = Client()
    outsider.force_login(guest)
    assert outsider.post(where, {"decision": "approve"}).status_code == 403
    page = Client()
    page.force_login(dad)
    assert "May I make this schedule?" in page.get("/conversation").content.decode()
    assert page.post(where, {"decision": "approve"}).status_code == 302
    made = Schedule.objects.get()
    assert (made.name, made.cron, made.created_by) == ("Water the roses", "0 6 * * MON", "dad")
    assert page.post(where, {"decision": "decline"}).status_code == 409  # answered once
    assert Message.objects.get(pk=proposal.pk).answer == "approved by dad"
