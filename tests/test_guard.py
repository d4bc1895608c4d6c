"""The guard (DESIGN.md §5): one test per row of the table, with cuts simulated in process
(tests/support/cuts.py), and the pure `guard.decide` cases."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import transaction

from loop import actions, effects, guard, lease, step_life
from loop.guard import Decision, EffectFacts, StepFacts
from loop.models import Effect, Event, Step, Task
from loop.step_life import Started
from loop.worker import Worker

from .conftest import claim_and_start, make_task, run_until_idle, step
from .support.cuts import (
    Partway,
    claimed_not_sent,
    cut,
    intent_only,
    next_worker,
    post,
    sent_and_recorded,
    sent_not_recorded,
)
from .support.sinks import Receiver


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as sink:
        yield sink


def kinds(task: Task) -> list[str]:
    return list(Event.objects.filter(task=task).values_list("kind", flat=True))


# ---- the §5 table, row by row --------------------------------------------------------------


def test_first_run_without_confirm_before_runs(worker: Worker, receiver: Receiver) -> None:
    task = make_task(post(receiver.url()))
    run_until_idle(worker)
    assert Step.objects.get(task=task).state == "done"
    assert len(receiver.posts) == 1


def test_first_run_with_confirm_before_asks_may_i_and_sends_nothing(
    worker: Worker, receiver: Receiver
) -> None:
    task = make_task(post(receiver.url(), confirm_before=True))
    run_until_idle(worker)
    pay = Step.objects.get(task=task)
    assert pay.state == "blocked" and pay.question_kind == "may_i" and pay.attempts == 0
    assert pay.question_text.startswith("May I do this?\nhttp.post → POST " + receiver.url())
    assert '{"amount": 5}' in pay.question_text
    assert Task.objects.get(pk=task.pk).state == "blocked"
    assert receiver.posts == [] and not Effect.objects.exists()


def test_confirm_before_defaults_from_the_setting(
    worker: Worker, receiver: Receiver, settings: Any
) -> None:
    settings.LOOP_CONFIRM_SIDE_EFFECTS = True
    task = make_task(post(receiver.url()), step("read-only"))
    run_until_idle(worker)
    assert Step.objects.get(task=task, key="pay").question_kind == "may_i"
    assert receiver.posts == []


def test_reentry_with_every_receipt_finishes_from_the_receipts(
    db: None, receiver: Receiver
) -> None:
    task = make_task(post(receiver.url()))
    cut(task, sent_and_recorded)
    run_until_idle(next_worker())
    pay = Step.objects.get(task=task)
    assert pay.state == "done" and pay.attempts == 2
    assert pay.output == {"status": 200, "body": {"received": 13}}
    assert "receipt_hit" in kinds(task)
    assert len(receiver.posts) == 1 and Effect.objects.get(task=task).sends == 1


@pytest.mark.parametrize("partway", [None, intent_only], ids=["no-effect-yet", "intent-only"])
def test_reentry_provably_unsent_asks_may_i_saying_it_never_went_out(
    db: None, receiver: Receiver, partway: Partway | None
) -> None:
    task = make_task(post(receiver.url()))
    cut(task, partway)
    run_until_idle(next_worker())
    pay = Step.objects.get(task=task)
    assert pay.state == "blocked" and pay.question_kind == "may_i"
    assert "interrupted before the call went out: nothing was sent" in pay.question_text
    assert pay.attempts == 1  # a guard that blocks is no start
    assert receiver.posts == []


def test_reentry_provably_unsent_with_resume_always_runs_and_says_so(
    db: None, receiver: Receiver, settings: Any
) -> None:
    settings.LOOP_RESUME_UNSENT = "always"
    task = make_task(post(receiver.url()))
    cut(task, intent_only)
    run_until_idle(next_worker())
    assert Step.objects.get(task=task).state == "done"
    assert "side_effect_resumed_unsent" in kinds(task)
    assert len(receiver.posts) == 1


@pytest.mark.parametrize(
    "partway", [sent_not_recorded, claimed_not_sent], ids=["sent", "claimed-only"]
)
def test_reentry_uncertain_asks_did_this_happen_naming_the_effect(
    db: None, receiver: Receiver, partway: Partway
) -> None:
    task = make_task(post(receiver.url()))
    cut(task, partway)
    run_until_idle(next_worker())
    pay, effect = Step.objects.get(task=task), Effect.objects.get(task=task)
    assert effect.state == "uncertain"
    assert effect.error == "its claim lapsed before the outcome was recorded"
    assert pay.state == "blocked" and pay.question_kind == "did_it_happen"
    assert pay.question_text.startswith(
        f'Did this happen?\nhttp.post → POST {receiver.url()}: {{"amount": 5}}'
    )
    assert len(receiver.posts) == (1 if partway is sent_not_recorded else 0)


def test_resume_always_never_covers_an_uncertain_effect(
    db: None, receiver: Receiver, settings: Any
) -> None:
    settings.LOOP_RESUME_UNSENT = "always"
    task = make_task(post(receiver.url()))
    cut(task, sent_not_recorded)
    run_until_idle(next_worker())
    assert Step.objects.get(task=task).question_kind == "did_it_happen"
    assert len(receiver.posts) == 1


def test_an_unconsumed_authorization_is_consumed_in_the_start_commit(
    worker: Worker, receiver: Receiver, dad: Any
) -> None:
    task = make_task(post(receiver.url(), confirm_before=True))
    run_until_idle(worker)
    pay = Step.objects.get(task=task)
    actions.unblock(step_id=pay.pk, decision="allow", actor="dad", user=dad)
    assert Step.objects.get(pk=pay.pk).authorized_by == "dad"

    class Abandoned(Exception):
        pass

    with pytest.raises(Abandoned), transaction.atomic():  # the start commit fails
        claimed = lease.claim(worker.worker_id)
        assert claimed is not None
        assert isinstance(step_life.begin_one(claimed[0], worker.holding(claimed[1])), Started)
        raise Abandoned
    assert Step.objects.get(pk=pay.pk).authorized_by == "dad"  # not consumed either
    assert "authorization_consumed" not in kinds(task)

    claim_and_start(worker)
    pay.refresh_from_db()
    assert pay.state == "running" and pay.attempts == 1 and pay.authorized_by == ""
    consumed = Event.objects.get(kind="authorization_consumed", step=pay)
    assert consumed.data["by"] == "dad"
    assert receiver.posts == []  # consumed at the start, before anything is sent


def test_a_safe_to_repeat_write_cut_mid_effect_simply_runs_again(db: None, file_root: Path) -> None:
    task = make_task(step("note", "file.write", args={"path": "n.txt", "content": "v2"}))
    cut(task, claimed_not_sent)
    assert Effect.objects.get(task=task).state == "running"
    run_until_idle(next_worker())
    note, effect = Step.objects.get(task=task), Effect.objects.get(task=task)
    assert note.state == "done" and not note.question_kind
    assert effect.state == "succeeded" and effect.sends == 2
    assert (file_root / "n.txt").read_text() == "v2"


def test_doubting_an_effect_that_was_settled_meanwhile_changes_nothing(
    db: None, receiver: Receiver
) -> None:
    task = make_task(post(receiver.url()))
    cut(task, sent_not_recorded)
    stale = Effect.objects.get(task=task)  # read as `running` …
    Effect.objects.filter(pk=stale.pk).update(state="succeeded")  # … settled by its late report
    effects.doubt(stale, actor="boot", why="server process ended before the effect completed")
    assert stale.state == "succeeded" and Effect.objects.get(pk=stale.pk).state == "succeeded"


# ---- guard.decide, pure ------------------------------------------------------------------------


def facts(**fields: Any) -> StepFacts:
    base: dict[str, Any] = {
        "state": "pending",
        "side_effect": True,
        "confirm_before": False,
        "attempts": 0,
        "max_attempts": 5,
        "retry_recorded": False,
        "authorized": False,
    }
    return StepFacts(**{**base, **fields})


CUT = {"state": "running", "attempts": 1}
SENT = EffectFacts("succeeded", safe_to_repeat=False)
PENDING = EffectFacts("pending", safe_to_repeat=False)
UNCERTAIN = EffectFacts("uncertain", safe_to_repeat=False)
DEAD = EffectFacts("running", safe_to_repeat=False, lease_live=False)
LIVE = EffectFacts("running", safe_to_repeat=False, lease_live=True)
REPEATABLE_DEAD = EffectFacts("running", safe_to_repeat=True, lease_live=False)


@pytest.mark.parametrize(
    ("step_facts", "effect_facts", "options", "expected"),
    [
        (facts(), [], {}, Decision.START),
        (facts(confirm_before=True), [], {}, Decision.ASK_MAY_I),
        (facts(confirm_before=True), [], {"standing": True}, Decision.START_AUTO_CONFIRMED),
        (facts(**CUT), [SENT], {}, Decision.START),
        (facts(**CUT), [SENT, PENDING], {}, Decision.ASK_MAY_I_UNSENT),
        (facts(**CUT), [], {}, Decision.ASK_MAY_I_UNSENT),
        (facts(**CUT), [PENDING], {"standing": True}, Decision.START_AUTO_CONFIRMED),
        (facts(**CUT), [PENDING], {"resume_unsent": "always"}, Decision.START_RESUMED_UNSENT),
        (facts(**CUT), [UNCERTAIN], {}, Decision.ASK_DID_IT_HAPPEN),
        (facts(**CUT), [DEAD], {"standing": True}, Decision.ASK_DID_IT_HAPPEN),
        (facts(**CUT, authorized=True), [UNCERTAIN], {}, Decision.ASK_DID_IT_HAPPEN),
        (facts(**CUT), [LIVE], {}, Decision.WAIT),
        (facts(authorized=True, attempts=1), [PENDING], {}, Decision.START_AUTHORIZED),
        (facts(authorized=True, attempts=5), [], {}, Decision.START_AUTHORIZED),
        (facts(**CUT, retry_recorded=True), [PENDING], {}, Decision.START),
        (facts(**CUT, repeatable=True), [REPEATABLE_DEAD], {}, Decision.START),
        (facts(state="running", attempts=5), [PENDING], {}, Decision.FAIL_CAP),
        (facts(side_effect=False, **CUT), [], {}, Decision.START),
        (facts(side_effect=False, state="running", attempts=5), [], {}, Decision.FAIL_CAP),
        (
            facts(authorized=True, authorized_other_call=True, confirm_before=True),
            [],
            {},
            Decision.ASK_MAY_I_AGAIN,
        ),
        (facts(attempts=1), [PENDING], {}, Decision.ASK_MAY_I),
        (facts(attempts=5), [PENDING], {}, Decision.ASK_MAY_I),
        (facts(side_effect=False, attempts=1), [], {}, Decision.START),
    ],
    ids=[
        "first-run",
        "first-run-confirm",
        "first-run-confirm-standing",
        "cut-all-receipts",
        "cut-receipt-and-unsent",
        "cut-nothing-dispatched",
        "cut-unsent-standing",
        "cut-unsent-resume-always",
        "cut-uncertain",
        "cut-dead-claim-standing-does-not-cover",
        "cut-uncertain-authorization-does-not-cover",
        "live-claim-waits",
        "authorized",
        "authorized-past-the-cap",
        "after-a-recorded-retry",
        "safe-to-repeat-cut",
        "cap",
        "read-only-cut",
        "read-only-cap",
        "authorized-for-another-call",
        "pending-again-authorization-cleared",
        "pending-again-authorization-cleared-past-the-cap",
        "read-only-pending-again",
    ],
)
def test_decide(
    step_facts: StepFacts,
    effect_facts: list[EffectFacts],
    options: dict[str, Any],
    expected: Decision,
) -> None:
    assert guard.decide(step_facts, effect_facts, **options) is expected


# ---- who wrote it (DESIGN.md §5): the pure rules ---------------------------------------------


def test_a_side_effect_no_person_wrote_asks_first_and_no_standing_pass_covers_it() -> None:
    assert guard.decide(facts(unasked=True), []) is Decision.ASK_MAY_I
    assert guard.decide(facts(unasked=True), [], standing=True) is Decision.ASK_MAY_I
    assert guard.decide(facts(), [], standing=True) is Decision.START
    assert guard.decide(facts(confirm_before=True), [], standing=True) is (
        Decision.START_AUTO_CONFIRMED
    )
    # Dad's answer covering its exact call starts it, once.
    assert guard.decide(facts(unasked=True, authorized=True), []) is Decision.START_AUTHORIZED


def test_a_proposal_never_starts_whatever_else_holds() -> None:
    for changes in ({}, {"authorized": True}, {"side_effect": False}, {"unasked": True}):
        assert guard.decide(facts(proposed=True, **changes), []) is Decision.AWAIT_APPROVAL


def test_pending_again_with_every_effect_settled_finishes_from_the_receipts() -> None:
    settled = [EffectFacts("succeeded", False)]
    assert guard.decide(facts(attempts=1), settled) is Decision.START
    # an edit cleared an answer (no effect of its call yet): asked again
    assert guard.decide(facts(attempts=1), []) is Decision.ASK_MAY_I
    assert guard.decide(facts(attempts=1), [EffectFacts("pending", False)]) is Decision.ASK_MAY_I
