"""A tick moves a batch of tasks a step each per commit (DESIGN.md §4): every step's start is
committed before it runs; up to LOOP_BATCH_EFFECTS side-effect steps run together, after the
read-only ones, sharing the outbox's commits, each effect claimed before it is performed. Of
those, at most one is a step whose cut would ask a person; the others settle themselves."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connections, transaction
from django.db.models import F
from django.utils import timezone

from loop import clock, lease
from loop.judges import Verdict
from loop.models import Effect, Event, Step, Task
from loop.models import Worker as WorkerRow
from loop.step_life import Started
from loop.transitions import Conflict
from loop.worker import Worker

from .conftest import make_task, run_until_idle, step
from .support.sinks import Receiver

# Real commits, so another connection sees only what is durable.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def commits(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per COMMIT on the worker's connection."""
    counted: list[int] = []
    wrapper = connections["default"]
    real = wrapper.commit

    def commit() -> None:
        counted.append(1)
        real()

    monkeypatch.setattr(wrapper, "commit", commit)
    return counted


def seen(key: str) -> dict[str, Any]:
    return step(key, "test.seen", args={})


def test_three_tasks_move_a_step_each_per_commit(worker: Worker, commits: list[int]) -> None:
    tasks = [make_task(seen(f"t{n}a"), seen(f"t{n}b"), title=f"t{n}") for n in range(3)]
    commits.clear()
    assert worker.tick() is True
    # The claim commit starts the three first steps; one verdict commit finishes them and
    # starts the three second steps; the last finishes those.
    assert len(commits) == 3
    for task in tasks:
        task.refresh_from_db()
        assert task.state == "done" and task.lease_owner is None
    for done in Step.objects.all():
        # While it ran, another connection saw it running: its start was durable.
        assert done.output["state"] == "running"
        assert len(done.output["running"]) == 3  # the whole batch was in flight
    kinds = [e.kind for e in Event.objects.filter(kind__in=["step_started", "step_done"])]
    # The verdict commit finishes the three first steps together, then starts the three next.
    assert (
        kinds == ["step_started"] * 3 + ["step_done"] * 3 + ["step_started"] * 3 + ["step_done"] * 3
    )


def test_side_effect_steps_run_last_and_together_sharing_the_outbox_commits(
    worker: Worker, commits: list[int]
) -> None:
    for n in range(3):
        make_task(seen(f"r{n}"), title=f"plain {n}")
    for n in range(4):
        make_task(step(f"e{n}", "test.seen_effect", args={}), title=f"effect {n}")
    commits.clear()
    assert worker.tick() is True
    # Claims, starts and the four intents; their four claims; the verdicts, with the four
    # outcomes (each call safe to repeat: its success is written with its step's verdict).
    assert len(commits) == 3
    assert Event.objects.filter(kind="effect_state", data__new="pending").count() == 4
    effect_keys = [f"e{n}" for n in range(4)]
    for effectful in Step.objects.filter(side_effect=True):
        assert effectful.state == "done"
        # All four were in flight at once, each with its own committed claim.
        assert effectful.output["running_side_effect"] == effect_keys
        assert effectful.output["effects_running"] == 4
    for plain in Step.objects.filter(side_effect=False):
        assert plain.output["running_side_effect"] == effect_keys  # started, not yet run
    assert set(Effect.objects.values_list("state", "sends")) == {("succeeded", 1)}


def test_a_batch_holds_at_most_loop_batch_effects_side_effect_steps(
    db: None, settings: Any
) -> None:
    settings.LOOP_BATCH_EFFECTS = 2
    worker = Worker(label="two at a time")
    worker.boot()
    for n in range(3):
        make_task(seen(f"r{n}"), step(f"e{n}", "test.seen_effect", args={}), title=f"t{n}")
    make_task(step("e-first", "test.seen_effect", args={}), title="effect first")
    run_until_idle(worker)
    assert set(Step.objects.values_list("state", flat=True)) == {"done"}
    for effectful in Step.objects.filter(side_effect=True):
        assert effectful.key in effectful.output["running_side_effect"]
        assert len(effectful.output["running_side_effect"]) <= 2
        assert effectful.output["effects_running"] <= 2
    for plain in Step.objects.filter(side_effect=False):
        assert len(plain.output["running_side_effect"]) <= 2
    assert max(len(s.output["running"]) for s in Step.objects.all()) > 2  # batches still mix


def test_a_batch_of_one_runs_one_step_at_a_time(db: None) -> None:
    worker = Worker(label="single", batch=1)
    worker.boot()
    for n in range(3):
        make_task(seen(f"s{n}"), title=f"t{n}")
    run_until_idle(worker)
    assert all(len(s.output["running"]) == 1 for s in Step.objects.all())


def test_a_batch_commits_what_it_has_once_its_steps_took_long(worker: Worker, settings) -> None:  # type: ignore[no-untyped-def]
    settings.LOOP_CHAIN_SECONDS = 0.2
    make_task(step("slow", "sleep", args={"seconds": 0.5}), title="slow")  # claimed first
    make_task(seen("quick"), title="quick")
    run_until_idle(worker)
    # The slow step's verdict was committed before the quick one ran, not held for the batch.
    assert Step.objects.get(key="quick").output["running"] == ["quick"]
    assert Step.objects.get(key="slow").state == "done"


def test_an_effect_step_left_waiting_by_a_slow_one_is_sent_once_from_its_intent(
    worker: Worker, settings: Any
) -> None:
    settings.LOOP_CHAIN_SECONDS = 0.2
    make_task(step("slow", "sleep", args={"seconds": 0.5}), title="slow")  # claimed first
    make_task(step("effect", "test.seen_effect", args={}), title="effect")
    run_until_idle(worker)
    effectful = Step.objects.get(key="effect")
    assert effectful.state == "done" and effectful.attempts == 1
    assert effectful.output["running"] == ["effect"]  # the slow one's verdict went first
    effect = Effect.objects.get(step=effectful)
    assert (effect.state, effect.sends) == ("succeeded", 1)
    moves = Event.objects.filter(effect=effect, kind="effect_state").order_by("id")
    assert [e.data["new"] for e in moves] == ["pending", "running", "succeeded"]


def test_in_a_batch_only_the_verdict_whose_lease_moved_on_is_refused(worker: Worker) -> None:
    make_task(seen("a"), title="a")
    b = make_task(seen("b"), title="b")
    with transaction.atomic():
        begun = worker.claim_batch()
    assert [s.step.key for s in begun if isinstance(s, Started)] == ["a", "b"]
    Task.objects.filter(pk=b.pk).update(lease_epoch=F("lease_epoch") + 1)  # another took b
    verdicts = [(s, Verdict.done({"ok": True})) for s in begun if isinstance(s, Started)]
    assert worker.commit_batch(verdicts, []) == []
    assert Step.objects.get(key="a").state == "done"
    assert Step.objects.get(key="b").state == "running"  # the new holder's to finish
    late = Event.objects.get(kind="late_result")
    assert late.step.key == "b" and late.data["verdict"] == "done"


def test_a_step_whose_lease_moved_on_mid_batch_does_not_cost_the_others(worker: Worker) -> None:
    make_task(seen("plain"), title="plain")
    moved = make_task(step("effect", "test.seen_effect", args={}), title="moved")
    with transaction.atomic():
        begun = worker.claim_batch()
    batch = [s for s in begun if isinstance(s, Started)]
    assert sorted(s.step.key for s in batch) == ["effect", "plain"]
    Task.objects.filter(pk=moved.pk).update(lease_epoch=F("lease_epoch") + 1)
    verdicts, waiting = worker.perform(batch)
    # The effect's claim was refused (nothing performed); the plain step's verdict stands.
    assert [s.step.key for s, _ in verdicts] == ["plain"] and waiting == []
    assert not Effect.objects.filter(state="running").exists()
    worker.commit_batch(verdicts, waiting)
    assert Step.objects.get(key="plain").state == "done"


def test_effects_whose_lease_moved_on_are_not_claimed_and_the_others_go_out(
    worker: Worker,
) -> None:
    tasks = [make_task(step(f"e{n}", "test.seen_effect", args={}), title=f"e{n}") for n in range(3)]
    with transaction.atomic():
        begun = worker.claim_batch()
    batch = [s for s in begun if isinstance(s, Started)]
    assert len(batch) == 3
    Task.objects.filter(pk=tasks[1].pk).update(lease_epoch=F("lease_epoch") + 1)
    verdicts, waiting = worker.perform(batch)
    assert sorted(s.step.key for s, _ in verdicts) == ["e0", "e2"] and waiting == []
    # The two still held were claimed together and performed (safe to repeat: their
    # successes are written with their verdicts); the moved one stays an intent.
    assert dict(Effect.objects.values_list("step__key", "state")) == {
        "e0": "running",
        "e1": "pending",
        "e2": "running",
    }
    worker.commit_batch(verdicts, waiting)
    assert dict(Effect.objects.values_list("step__key", "state")) == {
        "e0": "succeeded",
        "e1": "pending",
        "e2": "succeeded",
    }
    for done in verdicts:
        assert done[1].output["effects_running"] == 2


def test_a_receipt_carried_by_a_verdict_is_written_even_when_the_verdict_comes_too_late(
    worker: Worker,
) -> None:
    tasks = [make_task(step(f"e{n}", "test.seen_effect", args={}), title=f"e{n}") for n in range(2)]
    with transaction.atomic():
        begun = worker.claim_batch()
    batch = [s for s in begun if isinstance(s, Started)]
    verdicts, _ = worker.perform(batch)
    assert all(len(v.receipts) == 1 for _, v in verdicts)  # performed, success not yet written
    Task.objects.filter(pk=tasks[1].pk).update(lease_epoch=F("lease_epoch") + 1)  # another took it
    worker.commit_batch(verdicts, [])
    # Both effects happened, and both say so; only the moved task's verdict was refused.
    assert set(Effect.objects.values_list("state", "sends")) == {("succeeded", 1)}
    assert dict(Step.objects.values_list("key", "state")) == {"e0": "done", "e1": "running"}
    assert Event.objects.get(kind="late_result").step.key == "e1"


def three_effect_steps(worker: Worker) -> list[Started]:
    """Three tasks of a side-effect step each (safe to repeat), claimed and started together."""
    for n in range(3):
        make_task(step(f"e{n}", "test.seen_effect", args={}), title=f"e{n}")
    with transaction.atomic():
        begun = worker.claim_batch()
    return [s for s in begun if isinstance(s, Started)]


def test_receipts_written_together_leave_one_that_moved_meanwhile_to_its_late_report(
    worker: Worker,
) -> None:
    batch = three_effect_steps(worker)
    verdicts, _ = worker.perform(batch)
    assert all(len(v.receipts) == 1 for _, v in verdicts)  # performed, success not yet written
    # A peer found e1's claim lapsed and made it uncertain before the verdicts' commit.
    Effect.objects.filter(step__key="e1").update(state="uncertain")
    worker.commit_batch(verdicts, [])
    # One statement wrote e0's and e2's successes (no savepoint: e1's row, no longer
    # running, was simply not changed); e1's success came as its late report, which settles
    # it: it did happen.
    assert dict(Effect.objects.values_list("step__key", "state")) == {
        "e0": "succeeded",
        "e1": "succeeded",
        "e2": "succeeded",
    }
    assert Event.objects.get(kind="late_result").step.key == "e1"
    assert "late report" in Effect.objects.get(step__key="e1").evidence
    succeeded = Event.objects.filter(kind="effect_state", data__new="succeeded")
    assert sorted(e.step.key for e in succeeded) == ["e0", "e1", "e2"]


def test_effects_claimed_together_go_one_by_one_when_one_was_settled_meanwhile(
    worker: Worker,
) -> None:
    batch = three_effect_steps(worker)
    assert len(batch) == 3
    Effect.objects.filter(step__key="e1").update(state="cancelled")  # by a person, meanwhile
    verdicts, _ = worker.perform(batch)
    # The claim of all three lost on e1 and was undone; e0 and e2 were then claimed one by
    # one (each once) and performed; e1 was neither claimed nor performed. Their successes
    # are written with the verdicts.
    worker.commit_batch(verdicts, [])
    assert dict(Effect.objects.values_list("step__key", "state")) == {
        "e0": "succeeded",
        "e1": "cancelled",
        "e2": "succeeded",
    }
    assert dict(Effect.objects.values_list("step__key", "sends")) == {"e0": 1, "e1": 0, "e2": 1}
    claims = Event.objects.filter(kind="effect_state", data__new="running")
    assert sorted(claim.step.key for claim in claims) == ["e0", "e2"]
    assert {s.step.key: v.kind for s, v in verdicts}["e0"] == "done"


def test_a_verdict_batch_that_finds_a_step_moved_commits_nothing(worker: Worker) -> None:
    make_task(seen("a"), title="a")
    make_task(seen("b"), title="b")
    with transaction.atomic():
        begun = worker.claim_batch()
    Step.objects.filter(key="b").update(state="blocked")  # not the state its start wrote
    verdicts = [(s, Verdict.done({"ok": True})) for s in begun if isinstance(s, Started)]
    with pytest.raises(Conflict):
        worker.commit_batch(verdicts, [])
    # Finished together or not at all: a's verdict went with the batch's transaction.
    assert dict(Step.objects.values_list("key", "state")) == {"a": "running", "b": "blocked"}
    assert not Event.objects.filter(kind="step_done").exists()


def test_one_statement_claims_the_least_claimed_free_tasks(worker: Worker) -> None:
    tasks = [make_task(seen(f"c{n}"), title=f"c{n}") for n in range(4)]
    Task.objects.filter(pk=tasks[0].pk).update(lease_epoch=5)  # claimed often before
    held_until = timezone.now() + timedelta(minutes=5)
    Task.objects.filter(pk=tasks[1].pk).update(lease_owner=99, lease_until=held_until)
    assert lease.claim_many(worker.worker_id, 2) == [(tasks[2].pk, 1), (tasks[3].pk, 1)]
    # What is left: the often-claimed one; never the one another holds.
    assert lease.claim_many(worker.worker_id, 5) == [(tasks[0].pk, 6)]
    assert Task.objects.get(pk=tasks[1].pk).lease_owner == 99


# ---- one question per crash at most: the batch's side-effect steps, by what a cut would need --


def running_at_once(tool: str) -> int:
    """The most effects of `tool` that were claimed and not yet settled at the same time, as
    the journal tells (claims and outcomes in commit order)."""
    flying = most = 0
    for event in Event.objects.filter(kind="effect_state").order_by("id"):
        if Effect.objects.get(pk=event.effect_id).tool != tool:
            continue
        flying += (event.data["new"] == "running") - (event.data.get("old") == "running")
        most = max(most, flying)
    return most


def test_a_batch_holds_one_side_effect_step_that_would_ask_if_cut_and_many_that_would_not(
    worker: Worker,
) -> None:
    for n in range(3):
        make_task(
            step(f"once-{n}", "test.seen_once", args={}),
            step(f"repeat-{n}", "test.seen_effect", args={}),
            title=f"t{n}",
        )
    for n in range(3):
        make_task(step(f"alone-{n}", "test.seen_effect", args={}), title=f"u{n}")
    run_until_idle(worker)
    assert set(Step.objects.values_list("state", flat=True)) == {"done"}
    for done in Step.objects.all():
        flying = done.output["running_side_effect"]
        assert len([key for key in flying if key.startswith("once-")]) <= 1, (done.key, flying)
    # The ones whose cut settles itself went together, beside the one that would ask.
    assert max(len(s.output["running_side_effect"]) for s in Step.objects.all()) >= 4
    assert running_at_once("test.seen_once") == 1
    assert running_at_once("test.seen_effect") >= 3


@pytest.mark.parametrize("listed", [False, True])
def test_posts_go_one_at_a_time_unless_their_receiver_deduplicates_on_the_key(
    worker: Worker, settings: Any, listed: bool
) -> None:
    with Receiver() as receiver:
        settings.LOOP_IDEMPOTENT_RECEIVERS = [receiver.url("/pay")] if listed else []
        tasks = [
            make_task(
                step("pay", "http.post", args={"url": receiver.url("/pay"), "json": [n]}),
                title=f"p{n}",
            )
            for n in range(4)
        ]
        run_until_idle(worker)
        assert len(receiver.posts) == 4
    assert all(Step.objects.get(task=task).state == "done" for task in tasks)
    assert running_at_once("http.post") == (4 if listed else 1)
    assert set(Effect.objects.values_list("safe_to_repeat", flat=True)) == {listed}


def test_a_cut_after_an_effect_that_would_ask_went_out_costs_one_question_and_no_second_send(
    worker: Worker, settings: Any
) -> None:
    """The success of an effect that would ask if cut is written with its step's verdict,
    not in a commit of its own (`effects.deferring`): a cut between the two leaves it
    `running` — the worker's only such effect, since the next is claimed only after that
    commit — and the next worker asks about it once, sending nothing again."""
    with Receiver() as receiver:
        settings.LOOP_IDEMPOTENT_RECEIVERS = []
        for n in range(3):
            make_task(
                *[
                    step(f"pay{i}", "http.post", args={"url": receiver.url(), "json": [n, i]})
                    for i in range(2)
                ],
                title=f"p{n}",
            )
        begun = worker.claim_batch()
        batch = [s for s in begun if isinstance(s, Started)]
        verdicts, _ = worker.perform(batch)  # then the worker is cut: no verdict commit
        assert len(batch) == 1 and len(receiver.posts) == 1
        assert [v.kind for _, v in verdicts] == ["done"] and verdicts[0][1].receipts
        assert sorted(Effect.objects.values_list("state", flat=True)) == ["running"]
        WorkerRow.objects.filter(pk=worker.worker_id).update(
            boot_id="another-kernel", last_seen=clock.db_now(-3600)
        )
        after = Worker(label="after the cut")
        after.boot()
        run_until_idle(after)
        bodies = [post.body for post in receiver.posts]
    assert len(bodies) == len(set(bodies)) == 5  # the cut task's second step waits for Dad
    asked = Step.objects.exclude(question_kind="")
    assert [(s.key, s.state, s.question_kind) for s in asked] == [
        ("pay0", "blocked", "did_it_happen")
    ]
    assert Step.objects.filter(state="done").count() == 4
