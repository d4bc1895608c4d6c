"""The three state machines of DESIGN.md §3 as plain data. No Django import.

Every change of a state field in the project goes through `check()`; nothing else decides
whether a move is legal. The tables are checked at import time: every state is reachable from
the initial one, and from every state a terminal one can be reached (no traps).
"""

from __future__ import annotations

from collections.abc import Mapping


class IllegalTransition(Exception):
    """A move the machine does not allow: "can't X when in Y"."""


class Machine:
    def __init__(
        self,
        name: str,
        initial: str,
        table: Mapping[str, Mapping[str, str]],
        terminal: frozenset[str],
    ) -> None:
        # table: state -> {event: next state}
        self.name = name
        self.initial = initial
        self.table = {state: dict(moves) for state, moves in table.items()}
        self.terminal = terminal
        self._check()

    @property
    def states(self) -> frozenset[str]:
        return frozenset(self.table)

    def check(self, state: str, event: str) -> str:
        """The state after `event` from `state`, or IllegalTransition."""
        try:
            moves = self.table[state]
        except KeyError:
            raise IllegalTransition(f"{self.name}: unknown state {state!r}") from None
        if event not in moves:
            raise IllegalTransition(f"{self.name}: can't {event} when {state}")
        return moves[event]

    def allows(self, state: str, event: str) -> bool:
        return event in self.table.get(state, {})

    def events(self) -> frozenset[str]:
        return frozenset(e for moves in self.table.values() for e in moves)

    def _reach(self, start: str) -> set[str]:
        seen, todo = {start}, [start]
        while todo:
            for nxt in self.table[todo.pop()].values():
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    def _check(self) -> None:
        for state, moves in self.table.items():
            for event, nxt in moves.items():
                if nxt not in self.table:
                    raise AssertionError(f"{self.name}: {state} --{event}--> unknown {nxt}")
            if state in self.terminal and moves:
                raise AssertionError(f"{self.name}: terminal state {state} has moves")
        unreachable = self.states - self._reach(self.initial)
        if unreachable:
            raise AssertionError(f"{self.name}: unreachable states {sorted(unreachable)}")
        for state in self.states:
            if not self._reach(state) & self.terminal:
                raise AssertionError(f"{self.name}: {state} is a trap")


STEP = Machine(
    "step",
    initial="pending",
    table={
        "pending": {
            "start": "running",
            "ask": "blocked",  # a side-effect step waiting for "May I do this?"
            "decline": "failed",  # proposed by Pippa or an agent; a person declined it
        },
        "running": {
            "restart": "running",  # re-entry after a cut or a recorded retry; attempts += 1
            "retry": "running",  # verdict: transient error, run again after retry_at
            "finish": "done",
            "ask": "blocked",  # verdict: uncertain outcome, or a question for a person
            "fail": "failed",  # verdict: definitive failure, or the attempt cap exceeded
        },
        "blocked": {
            "unblock": "pending",  # only through a person's decision
            "moot": "pending",  # "Did this happen?" answered by the world (a late report)
            "fail": "failed",  # denied, or "fail the step"
        },
        "done": {},
        "failed": {},
    },
    terminal=frozenset({"done", "failed"}),
)

TASK = Machine(
    "task",
    initial="planning",
    table={
        # Created from a goal: its planning step (Pippa writing the plan) runs first.
        "planning": {
            "start": "running",  # the plan is written (and needs no approval)
            "propose": "paused",  # LOOP_CONFIRM_PLANS: the plan waits for Dad's approval
            "block": "blocked",  # the planning step asks Dad a question
            "fail": "failed",  # no plan: the planning step failed, or wrote no steps
            "supersede": "superseded",
        },
        "running": {
            "pause": "paused",
            "block": "blocked",
            "finish": "done",
            "fail": "failed",
            "supersede": "superseded",
        },
        "paused": {
            "resume": "running",
            "fail": "failed",
            "finish": "done",
            "supersede": "superseded",
        },
        "blocked": {
            "unblock": "running",
            "replan": "planning",  # the planning step's question was answered
            "pause": "paused",
            "fail": "failed",
            "supersede": "superseded",
        },
        "done": {},
        "failed": {},
        "superseded": {},
    },
    terminal=frozenset({"done", "failed", "superseded"}),
)

EFFECT = Machine(
    "effect",
    initial="pending",
    table={
        "pending": {"claim": "running", "cancel": "cancelled"},
        "running": {
            "succeed": "succeeded",
            "reject": "failed",
            "not_sent": "pending",  # EffectNotSent: it certainly did not leave
            "doubt": "uncertain",  # any other outcome, or its owner died mid-call
            "requeue": "pending",  # boot: a safe-to-repeat kind whose owner died
        },
        "uncertain": {
            "succeed": "succeeded",  # "it happened", a probe found it, or a late report
            "rerun": "pending",  # "it did not; do it"
            "cancel": "cancelled",
        },
        "succeeded": {},
        "failed": {},
        "cancelled": {},
    },
    terminal=frozenset({"succeeded", "failed", "cancelled"}),
)
