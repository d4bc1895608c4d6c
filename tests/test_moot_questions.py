"""A "Did this happen?" the world answers after it was asked (DESIGN.md §6: ask a person only
when it matters): a holder cut off while its POST was in flight reports the success late, after
another worker took the step for dead and asked Dad. The question names nothing any more; the
loop withdraws it and the step finishes from the receipt, nothing sent again (the nemesis
suite's run 2 met such a question, which no answer could fit)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import transaction

from loop import actions, effects, tools
from loop.models import Effect, EffectState, Event, EventKind, Step, StepState, TaskState

from .conftest import make_task, run_until_idle
from .support.cuts import claimed_not_sent, cut, next_worker, post
from .support.sinks import Receiver

pytestmark = pytest.mark.django_db


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as sink:
        yield sink


def test_a_late_report_withdraws_the_question_and_the_step_finishes_from_its_receipt(
    receiver: Receiver,
) -> None:
    task = make_task(post(receiver.url()))
    gone = cut(task, claimed_not_sent)  # its holder is cut off with the POST in flight
    worker = next_worker()
    run_until_idle(worker)
    pay = Step.objects.get(task=task)
    assert pay.state == StepState.BLOCKED and pay.question_kind == "did_it_happen"
    [effect] = Effect.objects.filter(step=pay)
    assert effect.state == EffectState.UNCERTAIN

    # The cut-off holder comes back: its POST had gone out, and it reports that now.
    request = effects.Request(gone.holder, pay, tools.get("http.post"), pay.args)
    with transaction.atomic():
        effects.record_receipts([effects.Receipt(request, effect, {"received": 17})])
    effect.refresh_from_db()
    assert effect.state == EffectState.SUCCEEDED and "late report" in effect.evidence

    assert actions.withdraw_moot_questions(actor="test") == 1
    assert actions.withdraw_moot_questions(actor="test") == 0
    pay.refresh_from_db()
    assert pay.state == StepState.PENDING and pay.question_kind == ""
    [withdrawn] = Event.objects.filter(step=pay, kind=EventKind.STEP_UNBLOCKED)
    assert withdrawn.data["decision"] == "answered by the world"
    run_until_idle(worker)
    pay.refresh_from_db()
    assert pay.state == StepState.DONE and pay.output == {"received": 17}
    assert task.__class__.objects.get(pk=task.pk).state == TaskState.DONE
    assert receiver.posts == []  # nothing was sent again (the first send was never made here)
    assert Event.objects.filter(step=pay, kind=EventKind.RECEIPT_HIT).exists()


def test_a_question_still_naming_an_uncertain_effect_stays(receiver: Receiver) -> None:
    task = make_task(post(receiver.url()))
    cut(task, claimed_not_sent)
    run_until_idle(next_worker())
    assert actions.withdraw_moot_questions(actor="test") == 0
    assert Step.objects.get(task=task).state == StepState.BLOCKED
