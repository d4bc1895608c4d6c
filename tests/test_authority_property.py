"""A property (DESIGN.md §5 "Who wrote it", invariant 13): for any sequence of plan writes by
Pippa, agents and persons, approvals, declines, edits, answers and cuts, every effect that
reached the receiver is covered by a person's answer covering its exact call (an approval, an
"Allow once", a "do it") or belongs to a step a person wrote; and none reached it twice."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import transaction
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from loop import actions, goals
from loop.api.core import issue
from loop.models import PERSON_WRITERS, Effect, Event, EventKind, Step, StepState, Task
from loop.permissions import SYSTEM, Agent, Pippa
from loop.worker import Worker

from .conftest import DAD_PERMISSIONS, make_task, permission_objects
from .support.cuts import cut, sent_not_recorded
from .support.sinks import Receiver

pytestmark = pytest.mark.django_db
EXAMPLES = itertools.count(1)  # each example's receiver path and agent name

WRITERS = ("person", "pippa", "agent")
op = st.one_of(
    st.tuples(
        st.just("write"),
        st.sampled_from(WRITERS),
        st.booleans(),  # a side effect (http.post) or a read-only echo
        st.booleans(),  # confirm_before as written
    ),
    st.tuples(st.sampled_from(["approve", "decline", "edit", "allow", "deny", "rerun"])),
    st.tuples(st.just("tick")),
    st.tuples(st.just("cut")),
)


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with Receiver() as sink:
        yield sink


class Run:
    """One example: a task of Dad's, given to an agent, that everyone writes into."""

    def __init__(self, receiver: Receiver, n: int) -> None:
        self.receiver = receiver
        self.url = receiver.url(f"/hook/{n}")
        self.dad = User.objects.get_or_create(username="dad")[0]
        self.dad.user_permissions.add(*permission_objects(*DAD_PERMISSIONS))
        self.dad = User.objects.get(pk=self.dad.pk)
        token = issue(name=f"bot{n}", user=self.dad)[0]
        self.agent = Agent(token)
        self.task = make_task({"key": "start", "tool": "echo", "args": {"value": 0}})
        actions.give(task_id=self.task.pk, agent=token.name, actor="dad", user=self.dad)
        self.worker = Worker(label="prop")
        self.worker.boot()
        self.written = 0

    def write(self, writer: str, side_effect: bool, confirm_before: bool) -> None:
        self.written += 1
        key = f"s{self.written}"
        if side_effect:
            args = {"url": self.url, "json": {"step": key}}
            new = {"key": key, "tool": "http.post", "args": args, "confirm_before": confirm_before}
        else:
            new = {"key": key, "tool": "echo", "args": {"value": key}}
        who = {
            "person": SYSTEM,
            "pippa": Pippa(self.task.pk, "start", 1),
            "agent": self.agent,
        }[writer]
        try:
            actions.add_steps(task_id=self.task.pk, steps=[new], actor=writer, user=who)
        except actions.Refused:
            pass  # the task ended

    def apply(self, one: tuple[Any, ...]) -> None:
        kind = one[0]
        task = Task.objects.get(pk=self.task.pk)
        blocked = Step.objects.filter(task=task, state=StepState.BLOCKED).first()
        try:
            if kind == "write":
                self.write(*one[1:])
            elif kind == "approve" and goals.waits_for_approval(task):
                actions.approve_plan(task_id=task.pk, actor="dad", user=self.dad)
            elif kind == "decline" and goals.waits_for_approval(task):
                actions.decline_plan(task_id=task.pk, actor="dad", user=self.dad)
            elif kind == "edit":
                pending = Step.objects.filter(
                    task=task, state=StepState.PENDING, tool="http.post"
                ).last()
                if pending is not None:
                    args = {"url": self.url, "json": {"step": pending.key, "edited": True}}
                    actions.edit_steps(
                        task_id=task.pk, edits={pending.pk: {"args": args}}, actor="x", user=SYSTEM
                    )
            elif kind in ("allow", "deny", "rerun") and blocked is not None:
                decision = {"may_i": {"allow", "deny"}, "did_it_happen": {"rerun"}}
                if kind in decision.get(blocked.question_kind, set()):
                    actions.unblock(step_id=blocked.pk, decision=kind, actor="dad", user=self.dad)
            elif kind == "tick":
                self.worker.tick()
            elif kind == "cut" and task.state == "running" and not task.lease_owner:
                upcoming = Step.objects.filter(task=task).open().first()
                if upcoming is not None and upcoming.state != StepState.BLOCKED:
                    cut(task, sent_not_recorded if upcoming.side_effect else None)
        except actions.Refused:
            pass  # a move that no longer fits the task's state: refused, nothing changed

    def check(self) -> None:
        mine = [
            p for p in self.receiver.posts if p.path == self.url.removeprefix(self.receiver.base)
        ]
        keys = [p.key for p in mine]
        assert len(keys) == len(set(keys)), "an effect reached the receiver twice"
        effects = {e.pk: e for e in Effect.objects.filter(task=self.task).select_related("step")}
        answers = Event.objects.filter(task=self.task)
        consumed = {
            (e.step_id, e.data.get("call"))
            for e in answers.filter(kind=EventKind.AUTHORIZATION_CONSUMED)
        }
        for post in mine:
            effect = effects[post.key]
            step = effect.step
            if step.writer in PERSON_WRITERS:
                continue
            assert (step.pk, effect.call) in consumed, (
                f"{step.key} ({step.writer}) sent {post.json} without a person's answer "
                "covering that call"
            )
            # ...and the answer was a person's: every authorization is given by dad.
            given = answers.filter(step=step).filter(
                kind__in=[EventKind.DECISION, EventKind.STEP_UNBLOCKED]
            )
            assert all(e.actor == "dad" for e in given)


@hypothesis_settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=st.lists(op, min_size=1, max_size=14))
def test_every_effect_that_reached_the_world_is_covered_by_a_person(
    receiver: Receiver, ops: list[tuple[Any, ...]]
) -> None:
    example = next(EXAMPLES)
    with transaction.atomic():  # each example from an empty plan: rolled back after it
        run = Run(receiver, example)
        for one in ops:
            run.apply(one)
        for _ in range(20):  # let the loop settle what it can
            if not run.worker.tick():
                break
        run.check()
        transaction.set_rollback(True)
