"""Invariant 6 (DESIGN.md §15): an authorization covers exactly one start, of exactly the call
it was given for. A hypothesis `RuleBasedStateMachine` drives payment steps through ticks, cuts
at every point of a call, receivers that answer ok / 500 / 408 / 400 / 429, Dad's answers
(allow, deny, happened, rerun, fail) and edits of the call, the title and the attempt cap; then
reads the journal and the receiver back:

- every authorization holds the digest of the call its question showed;
- a start that consumed one ran that call and no other (every intent, claim and receipt of the
  start, and every request that reached the receiver, is of that call);
- each authorization is consumed by at most one start, and never after it was cleared.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any

from django.contrib.auth.models import Permission, User
from django.db import transaction
from django.db.models import QuerySet
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from loop import actions, calls, effects, lease, plans, step_life, tools
from loop.models import Effect, Event, Step, StepState, Task
from loop.permissions import SYSTEM
from loop.step_life import Started
from loop.worker import Worker

from .conftest import make_task, step
from .support.cuts import Killed
from .support.sinks import Receiver

ANSWERS = {
    "allow": "may_i",
    "deny": "may_i",
    "happened": "did_it_happen",
    "rerun": "did_it_happen",
    "fail": "did_it_happen",
}
GRANTING = ("allow", "happened", "rerun")


class AuthorizationMachine(RuleBasedStateMachine):
    """Each example runs in a savepoint of the test's transaction, rolled back at teardown."""

    def __init__(self) -> None:
        super().__init__()
        self._atomic = transaction.atomic()
        self._atomic.__enter__()
        self.receiver = Receiver().__enter__()
        self.runner = Worker(label="hypothesis")
        self.runner.boot()
        self.doomed = Worker(label="doomed")
        self.doomed.boot()
        dad = User.objects.create_user("dad")
        dad.user_permissions.add(Permission.objects.get(codename="confirm_step"))
        self.dad = User.objects.get(pk=dad.pk)
        self.task = make_task(self._pay(1, confirm_before=True))
        self.pays = [self.task.steps.get().pk]
        self.runner.tick()  # it asks "May I do this?"

    def teardown(self) -> None:
        self.receiver.__exit__(None, None, None)
        transaction.set_rollback(True)
        self._atomic.__exit__(None, None, None)

    def _pay(self, amount: int, *, confirm_before: bool) -> dict[str, Any]:
        args = {"url": self.receiver.url("/pay"), "json": {"amount": amount}}
        return step(f"pay{amount}", "http.post", args=args, confirm_before=confirm_before)

    def _open_steps(self) -> QuerySet[Step]:
        return Step.objects.filter(pk__in=self.pays).exclude(
            state__in=[StepState.DONE, StepState.FAILED]
        )

    def _open(self) -> list[Step]:
        return list(self._open_steps())

    def _any_open(self, *states: str) -> bool:
        """Whether _open() would list a step (in one of `states`, if given): for the
        preconditions, checked before every rule, without loading the rows."""
        open_steps = self._open_steps()
        return (open_steps.filter(state__in=states) if states else open_steps).exists()

    # ---- the world -----------------------------------------------------------------------------

    @rule(how=st.sampled_from(["ok", "ok", "500", "408", "400", "429"]))
    def receiver_answers_next(self, how: str) -> None:
        self.receiver.behave(how)

    @rule()
    def tick(self) -> None:
        self.runner.tick()

    @rule(where=st.sampled_from(["started", "intent", "claimed", "sent", "recorded"]))
    def cut(self, where: str) -> None:
        """A worker claims the task and starts its step, gets to `where` in the step's call,
        and dies: its leases run out."""
        with transaction.atomic():
            claimed = lease.claim(self.doomed.worker_id)
            if claimed is None:
                return
            begun = step_life.begin_one(claimed[0], self.doomed.holding(claimed[1]))
        if isinstance(begun, Started) and where != "started":
            tool = tools.get(begun.step.tool)

            def run(args: dict[str, Any], effect_id: str) -> dict[str, Any]:
                if where == "claimed":
                    raise Killed
                result = tool.run(args, effect_id)
                if where == "sent":
                    raise Killed
                return result

            request = effects.Request(
                begun.holder,
                begun.step,
                dataclasses.replace(tool, run=run),
                plans.resolved_args(begun.step),
            )
            try:
                if where == "intent":
                    effects.intend_all([request])
                else:
                    effects.send_all([request])
            except Killed:
                pass
        Task.objects.filter(pk=self.task.pk).update(lease_until=None)
        Effect.objects.filter(task=self.task).update(lease_until=None)

    # ---- Dad and the editors ---------------------------------------------------------------------

    def _blocked(self) -> list[Step]:
        return [s for s in self._open() if s.state == StepState.BLOCKED]

    @precondition(lambda self: self._any_open(StepState.BLOCKED))
    @rule(
        data=st.data(),
        decision=st.sampled_from([*ANSWERS, "allow", "allow", "happened", "rerun"]),
    )
    def answer(self, data: st.DataObject, decision: str) -> None:
        pay = data.draw(st.sampled_from(self._blocked()))
        shown = calls.digest(pay.tool, pay.args)  # the call its question shows
        try:
            actions.unblock(step_id=pay.pk, decision=decision, actor="dad", user=self.dad)
        except actions.Refused:
            assert ANSWERS[decision] != pay.question_kind
            return
        pay.refresh_from_db()
        if decision in GRANTING:
            assert (pay.authorized_by, pay.authorized_call) == ("dad", shown)

    @precondition(lambda self: self._any_open())
    @rule(
        data=st.data(),
        change=st.sampled_from(["amount", "tool", "title", "max_attempts", "amount_and_title"]),
        amount=st.integers(1, 4),
    )
    def edit(self, data: st.DataObject, change: str, amount: int) -> None:
        pay = data.draw(st.sampled_from(self._open()))
        fields: dict[str, Any] = {}
        if change.startswith("amount"):
            fields["args"] = {**pay.args, "json": {"amount": amount}}
        if change == "tool":
            fields["tool"] = "http.put" if pay.tool == "http.post" else "http.post"
        if change.endswith("title"):
            fields["title"] = f"title {amount}"
        if change == "max_attempts":
            fields["max_attempts"] = amount
        fixed = calls.why_fixed(pay)
        new_call = calls.changes_call(pay, fields)
        try:
            edited, _ = actions.edit_steps(
                task_id=self.task.pk, edits={pay.pk: fields}, actor="ed", user=SYSTEM
            )
        except actions.Refused as exc:
            assert new_call and fixed and str(exc) == fixed
            return
        assert not (new_call and fixed and pay.state == StepState.PENDING)
        after = Step.objects.get(pk=pay.pk)
        if edited and new_call:
            assert (after.authorized_by, after.authorized_call) == ("", "")
        elif edited:
            assert (after.authorized_by, after.authorized_call) == (
                pay.authorized_by,
                pay.authorized_call,
            )

    @precondition(lambda self: len(self.pays) < 4)
    @rule(confirm_before=st.booleans())
    def add_a_payment(self, confirm_before: bool) -> None:
        try:
            [added] = actions.add_steps(
                task_id=self.task.pk,
                steps=[self._pay(len(self.pays) + 1, confirm_before=confirm_before)],
                actor="pippa",
                user=SYSTEM,
            )
        except actions.Refused:
            assert Task.objects.get(pk=self.task.pk).state in ("done", "failed", "superseded")
            return
        self.pays.append(added.pk)

    @rule()
    def resume(self) -> None:
        if Task.objects.get(pk=self.task.pk).state == "paused":
            actions.resume(task_id=self.task.pk, actor="dad", user=SYSTEM)

    # ---- the invariant ---------------------------------------------------------------------------

    @invariant()
    def an_authorization_covers_one_start_of_its_call(self) -> None:
        effects = {e.pk: e for e in Effect.objects.all()}
        requests = {pk: calls.digest(e.tool, e.request) for pk, e in effects.items()}
        journals: dict[int, list[Event]] = defaultdict(list)  # each pay's events, in order
        for event in Event.objects.filter(step_id__in=self.pays).order_by("id"):
            journals[event.step_id].append(event)
        for pay in self.pays:
            granted: str | None = None  # the digest an unconsumed authorization holds
            running: str | None = None  # the call the current start consumed one for
            awaiting_consumption = False
            for event in journals[pay]:
                kind, data = event.kind, event.data
                if awaiting_consumption:
                    assert kind == "authorization_consumed", f"step {pay}: {kind} after a start"
                    awaiting_consumption = False
                if kind == "step_unblocked" and data["decision"] in GRANTING:
                    assert granted is None, "an answer while another one was unconsumed"
                    granted = data["call"]
                elif kind == "authorization_cleared":
                    assert granted is not None and data["call"] == granted
                    granted = None
                elif kind in ("step_started", "step_restarted"):
                    running = None
                    awaiting_consumption = granted is not None
                elif kind == "authorization_consumed":
                    assert granted is not None, "consumed without an authorization"
                    assert data["call"] == granted
                    running, granted = granted, None
                elif event.effect_id is not None and running is not None:
                    # Every intent, claim and receipt of an authorized start is of its call.
                    assert requests[event.effect_id] == running, f"{kind} of another call"
        for request in self.receiver.posts:
            effect = effects.get(request.key or "")
            assert effect is not None, f"a request of no effect reached the receiver: {request}"
            assert request.json == effect.request["json"]
            assert request.method == effect.tool.removeprefix("http.").upper()


def test_an_authorization_covers_one_start_of_exactly_its_call(db: None, settings: Any) -> None:
    settings.LOOP_RETRY_BASE_SECONDS = 0  # a retry verdict may run again at the next tick
    settings.LOOP_RETRY_MAX_SECONDS = 0  # even after a 429's Retry-After
    settings.LOOP_HTTP_PROBE_URL = ""
    run_state_machine_as_test(
        AuthorizationMachine,
        settings=hypothesis_settings(max_examples=100, stateful_step_count=50, deadline=None),
    )
