"""Test tools: `test.record` writes every execution to a file; `test.flaky` fails transiently;
`test.seen`, `test.seen_effect` and `test.seen_once` report what another connection sees while
they run; `test.garbled` answers an output no database stores (a tool that forgot
`tools.storable`).

Each record is one line, appended with a single O_APPEND write so processes killed at any moment
leave whole lines:

    begin <task> <step key> <attempt> <pid> <epoch> <monotonic ns>
    end   <task> <step key> <attempt> <pid> <epoch> <monotonic ns>

CLOCK_MONOTONIC is one clock for every process on the host, so intervals compare across workers.
"""

from __future__ import annotations

import os
import random
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from django.db import connections

from loop.tools import Arg, Call, ToolError, current_call, tool


class Flaky(Exception):
    """A transient failure of a read-only call: the judge answers with a `retry` verdict."""


def _call() -> Call:
    call = current_call()
    if call is None:
        raise ToolError("test tools run only inside a judge")
    return call


def _append(path: str, what: str, call: Call) -> None:
    line = (
        f"{what} {call.task_id} {call.step_key} {call.attempt} {os.getpid()} {call.epoch} "
        f"{time.monotonic_ns()}\n"
    )
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


@tool(
    "test.record",
    args={
        "log": Arg("string"),
        "sleep_ms": Arg("list", required=False, items="integer"),  # [low, high]
        "first_sleep": Arg("number", required=False),  # seconds, on attempt 1 only
    },
)
def record(args: dict[str, Any]) -> dict[str, Any]:
    call = _call()
    _append(args["log"], "begin", call)
    low, high = args.get("sleep_ms") or [0, 0]
    pause = random.uniform(low, high) / 1000
    if call.attempt == 1:
        pause += float(args.get("first_sleep", 0))
    # An Event's wait, not time.sleep: under faketime with FAKETIME_DONT_FAKE_MONOTONIC (the
    # nemesis suite's worker whose clock is off) libfaketime makes time.sleep fail (EINVAL).
    threading.Event().wait(pause)
    _append(args["log"], "end", call)
    return {"pid": os.getpid(), "epoch": call.epoch, "attempt": call.attempt}


@tool("test.flaky", args={"fail_first": Arg("integer")})
def flaky(args: dict[str, Any]) -> dict[str, Any]:
    """Fails transiently on its first `fail_first` attempts."""
    call = _call()
    if call.attempt <= args["fail_first"]:
        raise Flaky(f"attempt {call.attempt} of {call.step_key} failed on purpose")
    return {"attempt": call.attempt}


def _seen() -> dict[str, Any]:
    """The committed truth while this step runs, read on a connection of its own: this
    step's state, and which steps are running."""
    call = _call()
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT state FROM loop_step WHERE id = %s", [call.step_id])
            (state,) = cursor.fetchone()
            cursor.execute("SELECT key, side_effect FROM loop_step WHERE state = 'running'")
            running = cursor.fetchall()
            cursor.execute("SELECT count(*) FROM loop_effect WHERE state = 'running'")
            (effects_running,) = cursor.fetchone()
    finally:
        other.close()
    return {
        "state": state,
        "running": sorted(key for key, _ in running),
        "running_side_effect": sorted(key for key, effectful in running if effectful),
        "effects_running": effects_running,  # claimed, committed, not yet settled
    }


@tool("test.seen", args={})
def seen(args: dict[str, Any]) -> dict[str, Any]:
    return _seen()


@tool("test.seen_effect", args={}, side_effect=True, safe_to_repeat=True)
def seen_effect(args: dict[str, Any], effect_id: str) -> dict[str, Any]:
    """A side effect whose cut settles itself (it only looks): many share a batch."""
    return _seen()


@tool("test.seen_once", args={}, side_effect=True)
def seen_once(args: dict[str, Any], effect_id: str) -> dict[str, Any]:
    """A side effect whose cut would ask "Did this happen?": a batch holds one at a time."""
    return _seen()


@tool("test.garbled", args={})
def garbled(args: dict[str, Any]) -> dict[str, Any]:
    return {"text": "a\x00b"}


@dataclass(frozen=True)
class Run:
    """One line pair of a `test.record` log: an execution, `end` None if it was cut."""

    task: int
    step: str
    attempt: int
    pid: int
    epoch: int
    begin: int
    end: int | None


def read_runs(path: Path) -> list[Run]:
    """Every execution recorded in `path`, in the order they began."""
    runs: dict[tuple[str, ...], Run] = {}
    if not path.exists():
        return []
    for line in path.read_text().splitlines():
        what, task, step, attempt, pid, epoch, ns = line.split()
        key = (task, step, attempt, pid, epoch)
        if what == "begin":
            assert key not in runs, f"execution recorded twice: {line}"
            runs[key] = Run(int(task), step, int(attempt), int(pid), int(epoch), int(ns), None)
        else:
            runs[key] = replace(runs[key], end=int(ns))
    return sorted(runs.values(), key=lambda run: run.begin)
