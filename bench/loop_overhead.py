"""Loop overhead: no-op read-only steps per second through a real `runloop` on SQLite (WAL,
synchronous=FULL), beside raw two-commit transactions (INSERT + COMMIT, UPDATE + COMMIT with
the plain `sqlite3` module) on the same disk in the same run, and their ratio.

    .venv/bin/python bench/loop_overhead.py [--tasks 40] [--steps 25] [--raw-seconds 3]

A step costs the loop two commits as well: its start (durable before it runs) and its verdict.
The step rate is measured from the journal: first `step_started` to last `step_done`, so the
worker's start-up and shutdown are not counted.
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


def create_tasks(tasks: int, steps: int) -> None:
    from django.core.management import call_command

    from loop import actions, plans

    call_command("migrate", verbosity=0)
    for n in range(tasks):
        spec = plans.validate(
            {
                "title": f"bench {n}",
                "steps": [
                    {"key": f"s{i}", "tool": "echo", "args": {"value": i}} for i in range(steps)
                ],
            }
        )
        actions.create_task(plan=spec, actor="bench")


def drain(folder: Path, expected: int) -> float:
    """Run one `runloop` until every task is done; steps per second from the journal."""
    from django.db import connection
    from django.db.models import Max, Min

    from loop.models import Event, Task

    env = {**os.environ, "PIPPA_DATA_DIR": str(folder), "LOOP_LOG_LEVEL": "WARNING"}
    connection.close()
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "runloop", "--worker-id", "bench"],
        env=env,
        cwd=ROOT,
    )
    try:
        deadline = time.monotonic() + 120
        while Task.objects.open().exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"runloop stopped or stalled (exit {proc.poll()})")
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    done = Event.objects.filter(kind="step_done")
    assert done.count() == expected, f"{done.count()} steps done, expected {expected}"
    span = Event.objects.filter(kind__in=["step_started", "step_done"]).aggregate(
        first=Min("created_at"), last=Max("created_at")
    )
    return expected / (span["last"] - span["first"]).total_seconds()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=40)
    parser.add_argument("--steps", type=int, default=25, help="echo steps per task")
    parser.add_argument("--raw-seconds", type=float, default=3.0)
    parser.add_argument("--dir", type=Path, default=ROOT / "var", help="where the files go")
    options = parser.parse_args()
    options.dir.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="bench-loop-", dir=options.dir))
    try:
        setup_django(folder)
        create_tasks(options.tasks, options.steps)
        raw_before = raw_two_commit_rate(folder, options.raw_seconds / 2)
        steps = drain(folder, options.tasks * options.steps)
        raw_after = raw_two_commit_rate(folder, options.raw_seconds / 2)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    raw = (raw_before + raw_after) / 2
    print(f"folder:        {folder.parent} (SQLite WAL, synchronous=FULL)")
    print(
        f"loop:          {steps:8.1f} no-op steps/s  ({options.tasks} tasks x {options.steps} steps, one runloop)"
    )
    print(
        f"raw sqlite3:   {raw:8.1f} two-commit tx/s  (before {raw_before:.1f}, after {raw_after:.1f})"
    )
    print(f"ratio:         {steps / raw:8.2f}  (target >= 0.5)")


if __name__ == "__main__":
    main()
