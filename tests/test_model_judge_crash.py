"""A model step cut by SIGKILL of a real `runloop` (DESIGN.md §12, Resume): the model's
side-effect call, committed in its transcript, is delivered exactly once, or asked about by
name; and the model is told what became of it."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loop import actions, transcript
from loop.models import Effect, EffectState, QuestionKind, Step, StepState, TaskState
from loop.models import Worker as WorkerRow
from loop.permissions import SYSTEM

from .conftest import kill, make_task, model_env, start_runloop, task_json, wait_for
from .support.llm_server import ModelServer, calls, commit, tool_results
from .support.sinks import Mailbox, Receiver, smtp_server

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def mailbox() -> Iterator[tuple[Mailbox, str, int]]:
    box = Mailbox()
    for host, port in smtp_server(box):
        yield box, host, port


def started_by(proc: subprocess.Popen[bytes]) -> None:
    wait_for(lambda: WorkerRow.objects.filter(pid=proc.pid).exists())


def test_sigkill_after_the_models_email_call_is_committed_sends_it_once_after_restart(
    settings: Any,
    tmp_path: Path,
    mailbox: tuple[Mailbox, str, int],
    processes: list[subprocess.Popen[bytes]],
) -> None:
    box, host, port = mailbox
    runs = tmp_path / "runs.log"
    mail = {"to": ["dad@example.com"], "subject": "Your digest", "body": "All is well."}

    def script(body: dict[str, Any], n: int) -> Any:
        if not tool_results(body["messages"]):
            # a slow read first (30 s on the first attempt), then the mail: the process is
            # killed while the mail's call is committed and not yet sent
            return calls(
                ("test_record", {"log": str(runs), "first_sleep": 30}), ("email_send", mail)
            )
        return commit(output={"mailed": True})

    with ModelServer(script) as model:
        settings.LOOP_LLM_BASE_URL = model.base_url
        task = make_task(
            {
                "key": "mail",
                "judge": "model",
                "instructions": "Mail Dad the digest.",
                "tools": ["test.record", "email.send"],
                "side_effect": True,
            }
        )
        env = model_env(model, EMAIL_HOST=host, EMAIL_PORT=str(port))
        first = start_runloop(env=env, log=tmp_path / "first.log")
        processes.append(first)
        wait_for(lambda: runs.exists() and "begin" in runs.read_text(), timeout=60)
        step = Step.objects.get(task=task)
        [reply] = [e for e in transcript.entries(step) if e.role == "assistant"]
        assert [c["name"] for c in reply.tool_calls] == ["test_record", "email_send"]
        kill(first)
        assert box.messages == [] and not Effect.objects.exists()

        second = start_runloop(env=env, log=tmp_path / "second.log")
        processes.append(second)
        wait_for(lambda: Step.objects.get(pk=step.pk).state == StepState.DONE, timeout=60)
        kill(second)

    assert len(box.messages) == 1
    assert box.messages[0]["Subject"] == "Your digest"
    # the read-only call left without a result ran again after the restart
    assert runs.read_text().count("begin") == 2
    [effect] = Effect.objects.filter(step=step)
    assert effect.state == EffectState.SUCCEEDED and effect.sends == 1
    rows = transcript.entries(step)
    assert transcript.unpaired(rows) == []
    mail_result = next(e for e in rows if e.role == "tool" and e.effect_id)
    assert mail_result.effect_id == effect.pk
    assert Step.objects.get(pk=step.pk).output == {"mailed": True}
    # the model was asked after the restart with both results, never told a vague "interrupted"
    assert len(tool_results(model.requests[-1]["messages"])) == 2


def test_sigkill_while_the_models_post_is_in_flight_asks_dad_then_tells_the_model(
    settings: Any, tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    with Receiver() as receiver:
        receiver.behave("hang")

        def script(body: dict[str, Any], n: int) -> Any:
            results = tool_results(body["messages"])
            if not results:
                return calls(("http_post", {"url": receiver.url("/pay"), "json": {"amount": 12}}))
            return commit(output={"paid": results[-1]})

        with ModelServer(script) as model:
            settings.LOOP_LLM_BASE_URL = model.base_url
            task = make_task(
                {
                    "key": "pay",
                    "judge": "model",
                    "instructions": "Pay the plumber 12.",
                    "tools": ["http.post"],
                    "side_effect": True,
                }
            )
            env = model_env(model)
            first = start_runloop(env=env, log=tmp_path / "first.log")
            processes.append(first)
            wait_for(lambda: len(receiver.posts) == 1, timeout=60)
            kill(first)

            second = start_runloop(env=env, log=tmp_path / "second.log")
            processes.append(second)
            step = wait_for(
                lambda: Step.objects.filter(task=task, state=StepState.BLOCKED).first(), timeout=60
            )
            [effect] = Effect.objects.filter(step=step)
            assert effect.state == EffectState.UNCERTAIN
            assert step.question_kind == QuestionKind.DID_IT_HAPPEN
            assert "Did this happen?" in step.question_text
            assert f"http.post → {effect.target}" in step.question_text
            asked = len(model.requests)

            actions.unblock(
                step_id=step.pk,
                decision="happened",
                actor="dad",
                user=SYSTEM,
                note="the plumber has the money",
            )
            wait_for(lambda: Step.objects.get(pk=step.pk).state == StepState.DONE, timeout=60)
            kill(second)
        receiver.release()

    assert len(receiver.posts) == 1
    told = tool_results(model.requests[-1]["messages"])
    assert told[-1] == "it happened (Dad, dad, said so: the plumber has the money)"
    assert len(model.requests) == asked + 1
    step.refresh_from_db()
    assert step.output == {"paid": told[-1]}
    assert step.task.state == TaskState.DONE
    rows = transcript.entries(step)
    assert transcript.unpaired(rows) == []
    assert [r.effect_id for r in rows if r.role == "tool"] == [effect.pk, ""]
    shown = task_json(task.pk)["steps"][0]
    assert [m["role"] for m in shown["transcript"]][-4:] == ["tool", "user", "assistant", "tool"]
    call_result = next(m for m in shown["transcript"] if m["effect"])
    assert call_result["effect"]["id"] == effect.pk
    assert call_result["effect"]["state"] == "succeeded"
    assert shown["tokens"]["prompt"] > 0
