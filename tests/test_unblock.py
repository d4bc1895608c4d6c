"""Unblock decisions (DESIGN.md §5): each answer, who may give it, and the one-shot
authorization it grants."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.exceptions import PermissionDenied
from django.core.management import CommandError, call_command

from loop import actions
from loop.models import Effect, Event, Step, Task
from loop.worker import Worker

from .conftest import ROOT, make_task, manage, process_env, run_until_idle, step
from .support.cuts import claimed_not_sent, cut, next_worker, post, sent_not_recorded
from .support.sinks import Receiver


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as sink:
        yield sink


def asking_may_i(worker: Worker, url: str, *more: dict[str, Any]) -> Step:
    task = make_task(post(url, confirm_before=True), *more)
    run_until_idle(worker)
    pay = Step.objects.get(task=task, key="pay")
    assert pay.question_kind == "may_i"
    return pay


def asking_did_it_happen(url: str, *more: dict[str, Any]) -> Step:
    """A payment whose POST reached the receiver, then its worker died before recording it."""
    task = make_task(post(url), *more)
    cut(task, sent_not_recorded)
    run_until_idle(next_worker())
    pay = Step.objects.get(task=task, key="pay")
    assert pay.question_kind == "did_it_happen"
    return pay


def decisions(pay: Step) -> list[tuple[str, str]]:
    return [(e.data["decision"], e.actor) for e in Event.objects.filter(kind="decision", step=pay)]


def test_allow_runs_the_step_once(worker: Worker, receiver: Receiver, dad: Any) -> None:
    pay = asking_may_i(worker, receiver.url())
    actions.unblock(step_id=pay.pk, decision="allow", actor="dad", user=dad)
    assert decisions(pay) == [("allow", "dad")]
    run_until_idle(worker)
    assert Step.objects.get(pk=pay.pk).state == "done"
    assert len(receiver.posts) == 1


# A denial never fails the task outright (DESIGN.md §17): it waits for a replacement.
@pytest.mark.parametrize(("more", "task_state"), [((), "paused"), ((step("after"),), "paused")])
def test_deny_fails_the_step_and_sends_nothing(
    worker: Worker, receiver: Receiver, dad: Any, more: tuple[dict[str, Any], ...], task_state: str
) -> None:
    pay = asking_may_i(worker, receiver.url(), *more)
    actions.unblock(step_id=pay.pk, decision="deny", actor="dad", user=dad, note="too much")
    pay.refresh_from_db()
    assert pay.state == "failed" and pay.error == "denied by dad: too much"
    assert Task.objects.get(pk=pay.task_id).state == task_state
    run_until_idle(worker)
    assert receiver.posts == []


def test_it_happened_keeps_the_note_as_the_receipt(db: None, receiver: Receiver, dad: Any) -> None:
    pay = asking_did_it_happen(receiver.url())
    actions.unblock(
        step_id=pay.pk, decision="happened", actor="dad", user=dad, note="bank shows it"
    )
    effect = Effect.objects.get(step=pay)
    assert effect.state == "succeeded" and effect.evidence == "bank shows it"
    run_until_idle(next_worker())
    pay.refresh_from_db()
    assert pay.state == "done" and pay.output == {"settled_by": "dad", "note": "bank shows it"}
    assert len(receiver.posts) == 1


def test_it_did_not_do_it_sends_once_more(db: None, receiver: Receiver, dad: Any) -> None:
    pay = asking_did_it_happen(receiver.url())
    actions.unblock(step_id=pay.pk, decision="rerun", actor="dad", user=dad)
    assert Effect.objects.get(step=pay).state == "pending"
    run_until_idle(next_worker())
    effect = Effect.objects.get(step=pay)
    assert Step.objects.get(pk=pay.pk).state == "done"
    assert effect.state == "succeeded" and effect.sends == 2
    assert [r.key for r in receiver.posts] == [effect.pk, effect.pk]  # the receiver can dedupe


@pytest.mark.parametrize(("more", "task_state"), [((), "failed"), ((step("after"),), "paused")])
def test_fail_the_step_cancels_its_effects(
    db: None, receiver: Receiver, dad: Any, more: tuple[dict[str, Any], ...], task_state: str
) -> None:
    pay = asking_did_it_happen(receiver.url(), *more)
    actions.unblock(step_id=pay.pk, decision="fail", actor="dad", user=dad)
    pay.refresh_from_db()
    assert pay.state == "failed" and Effect.objects.get(step=pay).state == "cancelled"
    assert Task.objects.get(pk=pay.task_id).state == task_state
    run_until_idle(next_worker())
    assert len(receiver.posts) == 1


@pytest.mark.parametrize("decision", ["allow", "deny"])
def test_an_answer_to_another_question_is_refused_and_changes_nothing(
    db: None, receiver: Receiver, dad: Any, decision: str
) -> None:
    pay = asking_did_it_happen(receiver.url())
    before = Event.objects.count()
    with pytest.raises(actions.Refused, match='does not answer "Did this happen\\?"'):
        actions.unblock(step_id=pay.pk, decision=decision, actor="dad", user=dad)
    pay.refresh_from_db()
    assert pay.state == "blocked" and pay.question_kind == "did_it_happen"
    assert Effect.objects.get(step=pay).state == "uncertain"
    assert Event.objects.count() == before


def test_a_user_without_confirm_step_is_refused_and_it_is_journaled(
    worker: Worker, receiver: Receiver, guest: Any
) -> None:
    pay = asking_may_i(worker, receiver.url())
    with pytest.raises(PermissionDenied):
        actions.unblock(step_id=pay.pk, decision="allow", actor="guest", user=guest)
    refused = Event.objects.get(kind="decision_refused", step=pay)
    assert refused.actor == "guest" and refused.data["decision"] == "allow"
    pay.refresh_from_db()
    assert pay.state == "blocked" and pay.authorized_by == ""
    run_until_idle(worker)
    assert receiver.posts == []


@pytest.mark.parametrize(
    "partway", [None, claimed_not_sent, sent_not_recorded], ids=["unsent", "claimed", "sent"]
)
def test_an_authorization_covers_exactly_one_start(
    worker: Worker, receiver: Receiver, dad: Any, partway: Any
) -> None:
    pay = asking_may_i(worker, receiver.url())
    actions.unblock(step_id=pay.pk, decision="allow", actor="dad", user=dad)
    cut(Task.objects.get(pk=pay.task_id), partway)  # the authorized run is cut again
    run_until_idle(next_worker())
    pay.refresh_from_db()
    assert pay.state == "blocked" and pay.attempts == 1
    assert pay.question_kind == ("may_i" if partway is None else "did_it_happen")
    assert len(receiver.posts) == (1 if partway is sent_not_recorded else 0)


def test_the_unblock_command_answers_and_keeps_the_note(db: None, receiver: Receiver) -> None:
    pay = asking_did_it_happen(receiver.url())
    call_command("unblock", str(pay.pk), "--happened", "--note", "saw it in the log")
    assert Effect.objects.get(step=pay).evidence == "saw it in the log"
    with pytest.raises(CommandError, match="is pending, not blocked"):
        call_command("unblock", str(pay.pk), "--fail")


def failing(*args: str) -> str:
    """Run manage.py in a child process; it must exit non-zero. Its stderr."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        capture_output=True,
        text=True,
        env=process_env(),
        timeout=120,
    )
    assert result.returncode != 0, result
    return result.stderr


def test_the_unblock_command_exits_nonzero_on_error(transactional_db: None) -> None:
    task = make_task(post("http://127.0.0.1:9/", confirm_before=True))
    run_until_idle(next_worker())
    pay = Step.objects.get(task=task)
    assert 'does not answer "May I do this?"' in failing("unblock", str(pay.pk), "--rerun")
    assert "no step 999999" in failing("unblock", "999999", "--allow")
    assert "is now pending" in manage("unblock", str(pay.pk), "--allow")  # exit status 0
    assert Step.objects.get(pk=pay.pk).authorized_by.startswith("cli:")
