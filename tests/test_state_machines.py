"""The three state machines: the tables themselves, and real rows driven through the real code.

Part one checks the pure tables of `loop.states` with a breadth-first search of its own (not
the module's import-time check). Part two is a hypothesis `RuleBasedStateMachine` that creates
tasks, ticks an in-process worker, cuts steps mid-flight, pauses, resumes and adds steps, and
after every rule checks the invariants of DESIGN.md §3 and §15 against the database.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.db.models import F
from django.utils import timezone
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from loop import actions, lease, plans, step_life
from loop.models import (
    ENDED_TASK_STATES,
    OPEN_STEP_STATES,
    EffectState,
    Event,
    Step,
    StepState,
    Task,
    TaskState,
)
from loop.permissions import SYSTEM
from loop.states import EFFECT, STEP, TASK, IllegalTransition, Machine
from loop.step_life import NeedsProbe, Started
from loop.worker import Worker

from .conftest import make_task, run_until_idle, step

MACHINES = {
    "step": (STEP, StepState, {"done", "failed"}),
    "task": (TASK, TaskState, {"done", "failed", "superseded"}),
    "effect": (EFFECT, EffectState, {"succeeded", "failed", "cancelled"}),
}


def reachable(machine: Machine, start: str) -> set[str]:
    seen, frontier = {start}, [start]
    while frontier:
        state = frontier.pop()
        for event in machine.events():
            if machine.allows(state, event):
                target = machine.check(state, event)
                if target not in seen:
                    seen.add(target)
                    frontier.append(target)
    return seen


# ---- the tables --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", MACHINES)
def test_terminal_states_are_exactly_the_final_ones_and_have_no_moves(name: str) -> None:
    machine, _, terminal = MACHINES[name]
    assert machine.terminal == terminal
    for state in terminal:
        assert not any(machine.allows(state, event) for event in machine.events())


@pytest.mark.parametrize("name", MACHINES)
def test_every_state_is_reachable_and_none_is_a_trap(name: str) -> None:
    machine, _, terminal = MACHINES[name]
    assert reachable(machine, machine.initial) == set(machine.states)
    for state in machine.states:
        assert reachable(machine, state) & terminal, f"{name}: {state} is a trap"


@pytest.mark.parametrize("name", MACHINES)
def test_the_table_knows_exactly_the_models_states(name: str) -> None:
    machine, choices, _ = MACHINES[name]
    assert set(machine.states) == set(choices.values)


def test_the_ended_and_open_states_the_code_uses_come_from_the_tables() -> None:
    assert set(ENDED_TASK_STATES) == {"done", "failed", "superseded"} == TASK.terminal
    assert set(OPEN_STEP_STATES) == {"pending", "running", "blocked"} == STEP.states - STEP.terminal
    assert OPEN_STEP_STATES == ("pending", "running", "blocked")  # the index step_open's order
    assert [s for s in TaskState if Task(state=s).ended] == list(ENDED_TASK_STATES)


@hypothesis_settings(max_examples=300, deadline=None)
@given(
    name=st.sampled_from(sorted(MACHINES)),
    data=st.data(),
)
def test_an_illegal_move_raises_cant_x_when_y(name: str, data: st.DataObject) -> None:
    machine = MACHINES[name][0]
    state = data.draw(st.sampled_from(sorted(machine.states)))
    event = data.draw(st.sampled_from(sorted(machine.events() | {"explode"})))
    if machine.allows(state, event):
        assert machine.check(state, event) in machine.states
    else:
        with pytest.raises(IllegalTransition, match=f"can't {event} when {state}$"):
            machine.check(state, event)


@hypothesis_settings(max_examples=200, deadline=None)
@given(name=st.sampled_from(sorted(MACHINES)), data=st.data())
def test_a_random_walk_ends_only_in_a_terminal_state(name: str, data: st.DataObject) -> None:
    machine, _, terminal = MACHINES[name]
    state = machine.initial
    for _ in range(30):
        moves = sorted(e for e in machine.events() if machine.allows(state, e))
        if not moves:
            break
        state = machine.check(state, data.draw(st.sampled_from(moves)))
    assert (state in terminal) == (not any(machine.allows(state, e) for e in machine.events()))


def test_a_table_with_a_trap_or_an_unreachable_state_is_refused_at_import() -> None:
    with pytest.raises(AssertionError, match="b is a trap"):
        Machine(
            "t", "a", {"a": {"go": "b", "end": "c"}, "b": {"spin": "b"}, "c": {}}, frozenset("c")
        )
    with pytest.raises(AssertionError, match=r"unreachable states \['z'\]"):
        Machine("u", "a", {"a": {"end": "c"}, "z": {"end": "c"}, "c": {}}, frozenset("c"))


# ---- real rows through the real code paths ---------------------------------------------------

STEP_SPECS = st.one_of(
    st.just({"tool": "echo"}),
    st.builds(
        lambda fail_first, cap: {
            "tool": "test.flaky",
            "args": {"fail_first": fail_first},
            "max_attempts": cap,
        },
        st.integers(0, 3),
        st.integers(1, 4),
    ),
)


class LoopMachine(RuleBasedStateMachine):
    """Each example runs in a savepoint of the test's transaction, rolled back at teardown."""

    def __init__(self) -> None:
        super().__init__()
        self._atomic = transaction.atomic()
        self._atomic.__enter__()
        self.runner = Worker(label="hypothesis")
        self.runner.boot()
        self.tasks: list[int] = []
        self.keys = 0
        self.finished: dict[int, tuple[str, int, Any]] = {}  # done/failed steps, as first seen
        self.never_run: set[int] = set()  # pending steps of superseded tasks

    def teardown(self) -> None:
        transaction.set_rollback(True)
        self._atomic.__exit__(None, None, None)

    def _steps(self, specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        made = []
        for spec in specs:
            self.keys += 1
            made.append(step(f"s{self.keys}", **spec))
        return made

    @initialize(specs=st.lists(STEP_SPECS, min_size=1, max_size=4))
    def first_task(self, specs: list[dict[str, Any]]) -> None:
        self.tasks.append(make_task(*self._steps(specs)).pk)

    @rule(specs=st.lists(STEP_SPECS, min_size=1, max_size=4))
    def create_task(self, specs: list[dict[str, Any]]) -> None:
        self.tasks.append(make_task(*self._steps(specs)).pk)

    @rule()
    def tick(self) -> None:
        self.runner.tick()

    @rule()
    def cut(self) -> None:
        """A worker claims a task and commits a step's start, then dies; its lease runs out."""
        with transaction.atomic():
            claimed = lease.claim(self.runner.worker_id)
            if claimed is None:
                return
            begun = step_life.begin_one(claimed[0], self.runner.holding(claimed[1]))
        assert not isinstance(begun, NeedsProbe)  # no side effects here: nothing to probe
        Task.objects.filter(pk=claimed[0]).update(lease_until=timezone.now() - timedelta(seconds=1))
        if isinstance(begun, Started):
            assert Step.objects.get(pk=begun.step.pk).state == StepState.RUNNING

    @precondition(lambda self: self.tasks)
    @rule(data=st.data(), move=st.sampled_from(["pause", "resume"]))
    def pause_or_resume(self, data: st.DataObject, move: str) -> None:
        task_id = data.draw(st.sampled_from(self.tasks))
        before = Task.objects.get(pk=task_id).state
        try:
            getattr(actions, move)(task_id=task_id, actor="dad", user=SYSTEM)
        except actions.Refused as exc:
            assert not TASK.allows(before, move), f"{move} refused from {before}: {exc}"
        else:
            assert TASK.allows(before, move)

    @precondition(lambda self: self.tasks)
    @rule(data=st.data(), specs=st.lists(STEP_SPECS, min_size=1, max_size=2), at_end=st.booleans())
    def add_steps(self, data: st.DataObject, specs: list[dict[str, Any]], at_end: bool) -> None:
        task = Task.objects.get(pk=data.draw(st.sampled_from(self.tasks)))
        keys = list(task.steps.order_by("position").values_list("key", flat=True))
        after = None if at_end else data.draw(st.sampled_from(keys))
        try:
            actions.add_steps(
                task_id=task.pk, steps=self._steps(specs), after=after, actor="pippa", user=SYSTEM
            )
        except (actions.Refused, plans.PlanError) as exc:
            started = task.steps.exclude(state=StepState.PENDING)
            if after is not None:
                anchor = task.steps.get(key=after).position
                started = started.filter(position__gt=anchor)
            assert task.state in ("done", "failed", "superseded") or started.exists(), str(exc)

    @precondition(lambda self: self.tasks)
    @rule(data=st.data(), specs=st.lists(STEP_SPECS, min_size=1, max_size=3))
    def supersede(self, data: st.DataObject, specs: list[dict[str, Any]]) -> None:
        task_id = data.draw(st.sampled_from(self.tasks))
        before = Task.objects.get(pk=task_id).state
        plan = plans.validate({"title": "successor", "steps": self._steps(specs)})
        try:
            successor = actions.supersede(task_id=task_id, plan=plan, actor="pippa", user=SYSTEM)
        except actions.Refused:
            assert not TASK.allows(before, "supersede")
            return
        self.tasks.append(successor.pk)
        self.never_run |= set(
            Step.objects.filter(task_id=task_id, state=StepState.PENDING).values_list(
                "pk", flat=True
            )
        )

    @rule()
    def drain(self) -> None:
        run_until_idle(self.runner, limit=500)  # the machine cannot spin forever

    # ---- invariants, checked after every rule ------------------------------------------------

    @invariant()
    def attempts_never_pass_the_cap(self) -> None:
        over = Step.objects.filter(attempts__gt=F("max_attempts"))
        assert not over.exists(), list(over.values("key", "attempts", "max_attempts"))

    @invariant()
    def a_done_or_failed_step_never_changes_again(self) -> None:
        for pk, state, attempts, output in Step.objects.filter(
            state__in=[StepState.DONE, StepState.FAILED]
        ).values_list("pk", "state", "attempts", "output"):
            first = self.finished.setdefault(pk, (state, attempts, output))
            assert first == (state, attempts, output), f"step {pk} changed after it ended"
        ended = set(self.finished)
        still = set(
            Step.objects.filter(
                pk__in=ended, state__in=[StepState.DONE, StepState.FAILED]
            ).values_list("pk", flat=True)
        )
        assert ended == still, f"steps {ended - still} left a terminal state"

    @invariant()
    def every_state_change_is_journaled(self) -> None:
        history: dict[tuple[str, int], list[tuple[str, str]]] = defaultdict(list)
        starts: dict[int, int] = defaultdict(int)
        for kind, step_id, task_id, data in Event.objects.order_by("id").values_list(
            "kind", "step_id", "task_id", "data"
        ):
            if kind == "task_state":
                history[("task", task_id)].append((data["old"], data["new"]))
            elif kind.startswith("step_") and "new" in data:
                history[("step", step_id)].append((data["old"], data["new"]))
                starts[step_id] += kind in ("step_started", "step_restarted")
        for name, model, initial in (("task", Task, "planning"), ("step", Step, "pending")):
            for pk, state in model.objects.values_list("pk", "state"):
                current = initial
                for old, new in history[(name, pk)]:
                    assert old == current, f"{name} {pk}: journal jumps from {current} to {old}"
                    current = new
                assert current == state, f"{name} {pk} is {state}, its journal says {current}"
        for pk, attempts in Step.objects.values_list("pk", "attempts"):
            assert starts[pk] == attempts, f"step {pk}: {attempts} attempts, {starts[pk]} starts"

    @invariant()
    def a_superseded_tasks_pending_steps_never_run(self) -> None:
        ran = Step.objects.filter(pk__in=self.never_run).exclude(state=StepState.PENDING)
        assert not ran.exists(), list(ran.values("key", "state"))

    @invariant()
    def no_task_is_done_with_an_open_step(self) -> None:
        done_with_open = Task.objects.filter(
            state=TaskState.DONE, steps__state__in=OPEN_STEP_STATES
        )
        assert not done_with_open.exists()
        unsettled = Step.objects.filter(task__state=TaskState.DONE, waived=False).exclude(
            state=StepState.DONE
        )
        assert not unsettled.exists(), "a done task has a step neither done nor waived"


def test_real_rows_keep_the_invariants_through_ticks_cuts_and_edits(
    db: None, settings: Any
) -> None:
    settings.LOOP_RETRY_BASE_SECONDS = 0  # a retry verdict may run again at the next tick
    run_state_machine_as_test(
        LoopMachine,
        settings=hypothesis_settings(max_examples=80, stateful_step_count=30, deadline=None),
    )
