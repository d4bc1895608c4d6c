"""Side-effect steps per second through a real `runloop`, beside the raw rate of three-commit
transactions on the same disk, and their ratio (issue 3: target 0.5 or more).

    .venv/bin/python bench/effect_overhead.py [--steps 2000] [--units 4000] [--rounds 3]
                                              [--dir DIR] [--explain]

Each step is an `http.post` to a sink started here that answers at once, so the figure is the
loop's own cost per effect: the intent (committed with the step's start), the fenced claim
commit, the outcome commit, the verdict commit (which also starts the task's next step and
writes its intent), and the Python between them. Each round measures it twice, side by side:

- the sink listed in LOOP_IDEMPOTENT_RECEIVERS (it settles a cut itself: the POSTs are safe to
  repeat), so a worker takes up to `LOOP_BATCH_EFFECTS` such steps (of different tasks) through
  those commits together and performs their effects at once — the figure the target is for;
- the sink not listed, so a cut would ask Dad and a worker sends one such effect at a time
  (`loop.step_life.ASKING_AT_ONCE`): every step pays those commits alone.

The step rate is taken
from the journal (first `step_started` to last `step_done`), so Django's start-up is not in
it. The raw rate is plain `sqlite3` in WAL mode with synchronous=FULL, in the same folder,
measured just before and just after each round: one unit = INSERT+COMMIT, UPDATE+COMMIT,
UPDATE+COMMIT. The figure given is the median round's ratio. Its CPU time is printed beside its
wall time (the rest is waiting for each COMMIT's fsync); a loop step's is mostly CPU, so the
ratio moves with how fast the disk syncs against how fast the processor runs Python.

`--explain` then runs 200 more steps through an in-process worker, for each way (batched; one at
a time), and splits a step's time into commits (fsync), executing SQL, performing the effects
(the HTTP round trips; a batch's at once) and the rest (Python), and gives the worker's CPU
time per step; beside them, the CPU time of
one POST as `http.post` sends it and of one statement through Django's cursor, measured on
their own, and the time a whole step may take for the ratio to reach the target.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


class Sink:
    """The local sink: an HTTP/1.1 server that reads each request whole and answers 200 at
    once, on an event loop (a thread per connection would make the sink, not the loop, the
    bottleneck once a worker sends several effects at a time). `Sink.apart()` runs it in a
    process of its own, so it never shares a GIL with the worker measured."""

    ANSWER = (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 12\r\n\r\n"
        b'{"ok": true}'
    )

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        started = threading.Event()
        threading.Thread(target=self._serve, args=(started,), daemon=True).start()
        started.wait()

    def _serve(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(asyncio.start_server(self._answer, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        started.set()
        self.loop.run_forever()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                await reader.readexactly(length)
                writer.write(self.ANSWER)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client closed its connection
        finally:
            writer.close()

    @staticmethod
    def apart() -> tuple[multiprocessing.process.BaseProcess, int]:
        """A sink in a child process, and its port."""
        ours, theirs = multiprocessing.Pipe()
        child = multiprocessing.get_context("fork").Process(
            target=Sink._serve_apart, args=(theirs,), daemon=True
        )
        child.start()
        return child, ours.recv()

    @staticmethod
    def _serve_apart(pipe: Any) -> None:
        pipe.send(Sink().port)
        threading.Event().wait()


def raw_units_per_second(path: Path, units: int) -> tuple[float, float]:
    """Raw three-commit units per second, and the CPU time of one unit in ms."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE unit (id INTEGER PRIMARY KEY, state TEXT, body TEXT)")
    began, cpu = time.perf_counter(), time.process_time()
    for n in range(1, units + 1):
        for sql, params in (
            ("INSERT INTO unit (id, state, body) VALUES (?, 'pending', ?)", (n, "x" * 200)),
            ("UPDATE unit SET state = 'running' WHERE id = ?", (n,)),
            ("UPDATE unit SET state = 'succeeded' WHERE id = ?", (n,)),
        ):
            db.execute("BEGIN IMMEDIATE")
            db.execute(sql, params)
            db.execute("COMMIT")
    elapsed, cpu = time.perf_counter() - began, time.process_time() - cpu
    db.close()
    return units / elapsed, cpu / units * 1000


def setup_django(folder: Path) -> dict[str, str]:
    """Django on a fresh SQLite file in `folder`, migrated; the environment a worker needs."""
    env = dict(os.environ)
    env.update(
        DATABASE_URL=f"sqlite:///{folder / 'loop.sqlite3'}",
        PIPPA_DATA_DIR=str(folder),
        LOOP_MIN_FREE_MB="0",
        LOOP_LOG_LEVEL="WARNING",
        LOOP_HTTP_ALLOW="127.0.0.1",  # its sink runs here (README "Tools")
        DJANGO_SETTINGS_MODULE="pippa_site.settings",
    )
    os.environ.update(env)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    return env


def loop_steps_per_second(
    env: dict[str, str], label: str, steps: int, url: str, *, listed: bool
) -> float:
    """Run `steps` side-effect steps (tasks of five, titled `label …`) through a real
    `runloop`, its sink `listed` as deduplicating or not; their steps per second, from the
    journal."""
    from loop import actions, plans
    from loop.models import Event, EventKind, Step
    from loop.permissions import SYSTEM

    per_task = 5
    for t in range(steps // per_task):
        plan = {
            "title": f"{label} {t}",
            "steps": [
                {"key": f"post-{i}", "tool": "http.post", "args": {"url": url, "json": [t, i]}}
                for i in range(per_task)
            ],
        }
        actions.create_task(plan=plans.validate(plan), actor="bench", user=SYSTEM)
    mine = Step.objects.filter(task__title__startswith=f"{label} ")
    total = mine.count()
    worker = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "runloop"],
        env={**env, "LOOP_IDEMPOTENT_RECEIVERS": url if listed else ""},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 600
        while mine.filter(state="done").count() < total:
            if time.monotonic() > deadline or worker.poll() is not None:
                raise SystemExit("the loop did not finish the bench steps")
            time.sleep(0.2)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=30)
    events = Event.objects.filter(task__title__startswith=f"{label} ")
    first = events.filter(kind=EventKind.STEP_STARTED).order_by("id").first()
    last = events.filter(kind=EventKind.STEP_DONE).order_by("-id").first()
    assert first and last
    return total / (last.created_at - first.created_at).total_seconds()


def split_ticks(runner: Any, steps: Any, digits: int = 2) -> dict[str, Any]:
    """Tick the booted in-process `runner` until it is idle, and split its time per step of
    `steps` (a queryset of the step_done events it made) into commits (fsync), executing SQL,
    performing the effects (`effects._perform`: a batch's at once) and the rest (Python);
    with its CPU time, statements and commits per step."""
    from django.db import connection

    from loop import effects

    spent = {"commit": 0.0, "sql": 0.0, "effect": 0.0}
    counted = {"statements": 0, "commits": 0}

    def timed(key: str, func: Any, count: str = "") -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            if count:
                counted[count] += 1
            began = time.perf_counter()
            try:
                return func(*args, **kwargs)
            finally:
                spent[key] += time.perf_counter() - began

        return run

    def sql(execute: Any, query: str, params: Any, many: bool, context: Any) -> Any:
        return timed("sql", execute, "statements")(query, params, many, context)

    perform = effects._perform
    effects._perform = timed("effect", perform)
    connection.commit = timed("commit", connection.commit, "commits")  # type: ignore[method-assign]
    began, cpu = time.perf_counter(), time.process_time()  # the sink runs in its own process
    try:
        with connection.execute_wrapper(sql):
            while runner.tick():
                pass
    finally:
        total, cpu = time.perf_counter() - began, time.process_time() - cpu
        del connection.commit
        effects._perform = perform
    count = steps.count()
    ms = {key: round(value / count * 1000, digits + 1) for key, value in spent.items()}
    ms["python"] = round(total / count * 1000 - sum(ms.values()), digits + 1)
    return {
        "steps": count,
        "ms_per_step": round(total / count * 1000, digits + 1),
        "cpu_ms_per_step": round(cpu / count * 1000, digits + 1),
        "split_ms": ms,
        "statements_per_step": round(counted["statements"] / count, digits),
        "commits_per_step": round(counted["commits"] / count, digits),
    }


def explain(url: str, steps: int = 200, *, listed: bool = True) -> dict[str, Any]:
    """Where a side-effect step's time goes, in an in-process worker (after django.setup), its
    sink `listed` (batched, as the target figure is) or not (one at a time)."""
    from django.conf import settings

    from loop import actions, plans
    from loop.models import Event, EventKind
    from loop.permissions import SYSTEM
    from loop.worker import Worker

    settings.LOOP_IDEMPOTENT_RECEIVERS = [url] if listed else []
    label = f"explain {'listed' if listed else 'alone'}"
    for t in range(steps // 5):
        plan = {
            "title": f"{label} {t}",
            "steps": [
                {"key": f"p{i}", "tool": "http.post", "args": {"url": url, "json": [t, i]}}
                for i in range(5)
            ],
        }
        actions.create_task(plan=plans.validate(plan), actor="bench", user=SYSTEM)
    runner = Worker(label="explain")
    runner.boot()
    done = Event.objects.filter(kind=EventKind.STEP_DONE, task__title__startswith=label)
    return split_ticks(runner, done, digits=1)


def parts(url: str, requests: int = 1000, statements: int = 2000) -> dict[str, float]:
    """The CPU time (ms) of two parts no side-effect step can do without, outside the loop:
    one POST on a new connection, as `http.post` sends it (`loop.tools.http`, on `http.client`:
    connect, write, read and judge the answer), and one one-row UPDATE through Django's cursor
    (as the loop runs each statement)."""
    from django.db import connection, transaction

    from loop import tools

    post = tools.get("http.post")
    assert post.start is not None
    began = time.process_time()
    for n in range(requests):
        post.start({"url": url, "json": [n, 0]}, f"{n:064d}")()
    request_ms = (time.process_time() - began) / requests * 1000
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("CREATE TEMP TABLE part (id INTEGER PRIMARY KEY, state TEXT)")
            cursor.execute("INSERT INTO part (id, state) VALUES (1, 'pending')")
        began = time.process_time()
        for n in range(statements):
            with connection.cursor() as cursor:
                cursor.execute("UPDATE part SET state = %s WHERE id = %s", [str(n), 1])
        statement_ms = (time.process_time() - began) / statements * 1000
        transaction.set_rollback(True)
    return {"http_post": round(request_ms, 3), "django_statement": round(statement_ms, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2000, help="side-effect steps per round")
    parser.add_argument("--units", type=int, default=4000, help="raw three-commit units")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; the median ratio counts")
    parser.add_argument("--dir", type=Path, default=None, help="folder for both databases")
    parser.add_argument("--explain", action="store_true", help="split a step's time, too")
    options = parser.parse_args()
    (ROOT / "var").mkdir(exist_ok=True)  # a fresh clone has none yet
    folder = Path(tempfile.mkdtemp(prefix="effect-overhead-", dir=options.dir or ROOT / "var"))
    sink, port = Sink.apart()
    url = f"http://127.0.0.1:{port}/hook"
    rounds = []
    try:
        env = setup_django(folder)
        for n in range(options.rounds):
            before, cpu_before = raw_units_per_second(folder / f"raw-{n}a.sqlite3", options.units)
            steps = loop_steps_per_second(env, f"round {n}", options.steps, url, listed=True)
            alone = loop_steps_per_second(env, f"alone {n}", options.steps, url, listed=False)
            after, cpu_after = raw_units_per_second(folder / f"raw-{n}b.sqlite3", options.units)
            raw = (before + after) / 2  # measured before and after the loop, on the same disk
            rounds.append((steps / raw, steps, raw, (cpu_before + cpu_after) / 2, alone / raw))
        split = None
        if options.explain:
            asking = explain(url, listed=False)
            split = {**explain(url), "one_at_a_time": asking, "parts_cpu_ms": parts(url)}
    finally:
        sink.kill()
        shutil.rmtree(folder, ignore_errors=True)
    ratio, steps, raw, raw_cpu, _ = sorted(rounds)[len(rounds) // 2]  # the median round
    alone_ratio = sorted(r[4] for r in rounds)[len(rounds) // 2]
    figures: dict[str, Any] = {
        "side_effect_steps_per_second": round(steps, 1),
        "one_at_a_time_steps_per_second": round(alone_ratio * raw, 1),
        "steps_per_round": options.steps,
        "raw_three_commit_units_per_second": round(raw, 1),
        "raw_unit_ms": round(1000 / raw, 3),
        "raw_unit_cpu_ms": round(raw_cpu, 3),
        "ratio": round(ratio, 3),
        "ratios_of_rounds": [round(r[0], 3) for r in rounds],
        "ratio_one_at_a_time": round(alone_ratio, 3),
        "ratios_one_at_a_time_of_rounds": [round(r[4], 3) for r in rounds],
        "target": 0.5,
        "target_one_at_a_time": 0.25,
    }
    if split:
        figures["explain"] = split
        figures["step_ms_for_target"] = round(1000 / (0.5 * raw), 3)
    print(json.dumps(figures))
    print(f"raw three-commit units/s: {raw:.1f} (median round of {len(rounds)})")
    print(f"{'receiver':<46} {'steps/s':>9} {'ratio':>7}")
    for name, rate, share in (
        ("listed, settles itself: batched (target 0.5)", steps, ratio),
        ("not listed, would ask Dad: alone (target 0.25)", alone_ratio * raw, alone_ratio),
    ):
        print(f"{name:<46} {rate:>9.1f} {share:>7.3f}")


if __name__ == "__main__":
    main()
