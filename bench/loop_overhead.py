"""Loop overhead: no-op read-only steps per second through a real `runloop` on SQLite (WAL,
synchronous=FULL), beside raw two-commit transactions (INSERT + COMMIT, UPDATE + COMMIT with
the plain `sqlite3` module) on the same disk in the same run, and their ratio.

    .venv/bin/python bench/loop_overhead.py [--rounds 7] [--tasks 12] [--steps 25]

One `runloop` drains a batch of tasks per round; each round's steps/s comes from the journal
(first `step_started` to last `step_done`, so start-up and idle polls are not counted) and is
set against raw rates measured just before and after it. Every step's start is durable before
the step runs: the worker moves a batch of tasks (`LOOP_BATCH`, default 8) a step each per
commit, and each commit holds the batch's verdicts and the starts of their next steps.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def raw_two_commit_rate(folder: Path, seconds: float) -> float:
    """Units per second, one unit = INSERT + COMMIT, then UPDATE + COMMIT."""
    path = folder / "raw.sqlite3"
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute(
        "CREATE TABLE IF NOT EXISTS unit (id INTEGER PRIMARY KEY, state TEXT, at REAL, out TEXT)"
    )
    units = 0
    start = time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        db.execute("BEGIN IMMEDIATE")
        row = db.execute(
            "INSERT INTO unit (state, at) VALUES ('running', ?)", (time.time(),)
        ).lastrowid
        db.execute("COMMIT")
        db.execute("BEGIN IMMEDIATE")
        db.execute("UPDATE unit SET state = 'done', out = '{}' WHERE id = ?", (row,))
        db.execute("COMMIT")
        units += 1
    db.close()
    return units / elapsed


def setup_django(folder: Path) -> None:
    os.environ["PIPPA_DATA_DIR"] = str(folder)
    os.environ.pop("DATABASE_URL", None)
    os.environ["DJANGO_SETTINGS_MODULE"] = "pippa_site.settings"
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()


def create_tasks(tasks: int, steps: int, batch: int) -> list[int]:
    """One commit, so the idle worker finds the whole batch at once."""
    from django.db import transaction

    from loop import actions, plans
    from loop.permissions import SYSTEM

    spec = plans.validate(
        {
            "title": f"bench {batch}",
            "steps": [{"key": f"s{i}", "tool": "echo", "args": {"value": i}} for i in range(steps)],
        }
    )
    with transaction.atomic():
        return [actions.create_task(plan=spec, actor="bench", user=SYSTEM).pk for _ in range(tasks)]


def drain(task_ids: list[int], proc: subprocess.Popen[bytes]) -> float:
    """Wait until the worker finished these tasks; their steps per second, from the journal:
    first `step_started` to last `step_done`."""
    from django.db.models import Max, Min

    from loop.models import Event, Task

    deadline = time.monotonic() + 120
    while Task.objects.filter(pk__in=task_ids).open().exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"runloop stopped or stalled (exit {proc.poll()})")
        time.sleep(0.05)
    events = Event.objects.filter(task_id__in=task_ids)
    done = events.filter(kind="step_done").count()
    span = events.filter(kind__in=["step_started", "step_done"]).aggregate(
        first=Min("created_at"), last=Max("created_at")
    )
    return done / (span["last"] - span["first"]).total_seconds()


def median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--tasks", type=int, default=12, help="tasks per round")
    parser.add_argument("--steps", type=int, default=25, help="echo steps per task")
    parser.add_argument("--raw-seconds", type=float, default=0.5, help="before and after a round")
    parser.add_argument("--dir", type=Path, default=ROOT / "var", help="where the files go")
    options = parser.parse_args()
    options.dir.mkdir(parents=True, exist_ok=True)
    options.dir.mkdir(parents=True, exist_ok=True)  # a fresh clone has no ./var yet
    folder = Path(tempfile.mkdtemp(prefix="bench-loop-", dir=options.dir))
    rows = []
    try:
        setup_django(folder)
        from django.core.management import call_command
        from django.db import connection

        call_command("migrate", verbosity=0)
        connection.close()
        env = {**os.environ, "LOOP_LOG_LEVEL": "WARNING", "LOOP_IDLE_SLEEP_MS": "20"}
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "runloop", "--worker-id", "bench"],
            env=env,
            cwd=ROOT,
        )
        try:
            for n in range(options.rounds):
                # The disk's speed drifts (other work on the machine): each round's loop rate
                # is compared with raw rates taken just before and just after it.
                before = raw_two_commit_rate(folder, options.raw_seconds)
                steps = drain(create_tasks(options.tasks, options.steps, n), proc)
                after = raw_two_commit_rate(folder, options.raw_seconds)
                raw = (before + after) / 2
                rows.append((steps, raw, steps / raw))
                print(
                    f"round {n + 1}: loop {steps:7.1f} steps/s   raw {raw:7.1f} tx/s   ratio {steps / raw:.2f}"
                )
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"folder:       {options.dir} (SQLite WAL, synchronous=FULL, same disk)")
    from django.conf import settings

    print(
        f"loop:         {median([r[0] for r in rows]):8.1f} no-op steps/s (median; one runloop, "
        f"LOOP_BATCH={settings.LOOP_BATCH}, {options.tasks} tasks x {options.steps} echo steps per round)"
    )
    print(
        f"raw sqlite3:  {median([r[1] for r in rows]):8.1f} two-commit tx/s (median; INSERT+COMMIT, UPDATE+COMMIT)"
    )
    print(
        f"ratio:        {median([r[2] for r in rows]):8.2f} (median of {len(rows)} rounds; target >= 0.5)"
    )


if __name__ == "__main__":
    main()
