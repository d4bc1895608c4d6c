"""A question left on a task that was superseded: its steps never run again, so the answers
that would run the step (Allow once, It did not — do it) are refused everywhere and not
offered; the answers that close the question (Deny, It happened, Fail the step) still work."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from loop import actions, plans
from loop.models import Effect, Event, Step, Task
from loop.permissions import SYSTEM
from loop.worker import Worker

from .conftest import run_until_idle, step
from .support.sinks import Receiver
from .test_unblock import asking_did_it_happen, asking_may_i


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as sink:
        yield sink


def superseded(pay: Step) -> None:
    plan = plans.validate({"title": "instead", "steps": [step("x")]})
    actions.supersede(task_id=pay.task_id, plan=plan, actor="dad", user=SYSTEM)
    assert Task.objects.get(pk=pay.task_id).state == "superseded"


def test_do_it_again_is_refused_on_a_superseded_task(
    worker: Worker, receiver: Receiver, dad: Any
) -> None:
    pay = asking_did_it_happen(receiver.url())
    superseded(pay)
    with pytest.raises(
        actions.Refused, match=r"superseded: its steps never run again.*'happened' or 'fail'"
    ):
        actions.unblock(step_id=pay.pk, decision="rerun", actor="dad", user=dad)
    with pytest.raises(CommandError, match="never run again"):
        call_command("unblock", str(pay.pk), "--rerun")
    assert Step.objects.get(pk=pay.pk).state == "blocked"
    assert list(Effect.objects.filter(step=pay).values_list("state", flat=True)) == ["uncertain"]
    assert not Event.objects.filter(kind="decision", step=pay).exists()

    actions.unblock(step_id=pay.pk, decision="happened", actor="dad", user=dad, note="seen it")
    assert list(Effect.objects.filter(step=pay).values_list("state", flat=True)) == ["succeeded"]
    run_until_idle(worker)
    assert len(receiver.posts) == 1  # the cut one; nothing was sent again
    assert Task.objects.get(pk=pay.task_id).state == "superseded"


def test_allow_is_refused_and_deny_closes_the_question(
    worker: Worker, receiver: Receiver, dad: Any
) -> None:
    pay = asking_may_i(worker, receiver.url())
    superseded(pay)
    with pytest.raises(actions.Refused, match="can't be done; answer 'deny'"):
        actions.unblock(step_id=pay.pk, decision="allow", actor="dad", user=dad)
    actions.unblock(step_id=pay.pk, decision="deny", actor="dad", user=dad)
    assert Step.objects.get(pk=pay.pk).state == "failed"
    assert Task.objects.get(pk=pay.task_id).state == "superseded"
    run_until_idle(worker)
    assert receiver.posts == []


def test_the_card_offers_only_the_closing_answers(
    worker: Worker, receiver: Receiver, dad: Any
) -> None:
    may = asking_may_i(worker, receiver.url())
    happened = asking_did_it_happen(receiver.url())
    client = Client()
    client.force_login(dad)
    before = client.get("/").content.decode()
    assert 'value="allow"' in before and 'value="rerun"' in before
    superseded(may)
    superseded(happened)
    page = client.get("/").content.decode()
    assert page.count("its steps never run again") == 2
    assert 'value="allow"' not in page and 'value="rerun"' not in page
    assert 'value="deny"' in page and 'value="happened"' in page and 'value="fail"' in page
    answer = client.post(f"/steps/{happened.pk}/decide", {"decision": "rerun"})
    assert answer.status_code == 409
    assert Step.objects.get(pk=happened.pk).state == "blocked"
