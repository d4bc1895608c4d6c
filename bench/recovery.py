"""Recovery: a worker SIGKILLed mid-step, and how soon its cut step starts again.

    .venv/bin/python bench/recovery.py [--repeat 5] [--database-url postgres://…/db]

(a) restart:        the same worker started again at once; from the new process being ready
                    (its `worker_started` event) to the cut step's `step_restarted`, and
                    from the SIGKILL, the new process's start (imports, boot) included.
(b) same host:      another worker already running; from the SIGKILL to `step_restarted`.
(b) other host:     the same, the killed worker recorded under another host name
                    (LOOP_WORKER_HOST), so only its heartbeat going stale can show it dead.

The defaults throughout (LOOP_LEASE_SECONDS 30, LOOP_HEARTBEAT_SECONDS 5, LOOP_WORKER_DEAD_AFTER
10, LOOP_REAP_SECONDS 0.5, LOOP_IDLE_SLEEP_MS 200). Without --database-url a fresh SQLite file
under ./var is used.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def setup_django(folder: Path, database_url: str) -> None:
    os.environ["PIPPA_DATA_DIR"] = str(folder)
    os.environ["PIPPA_EXTRA_APPS"] = "tests.support.loopapp"  # test.record: a step that hangs
    os.environ["LOOP_LOG_LEVEL"] = "ERROR"
    if database_url:
        os.environ["DATABASE_URL"] = database_url
    else:
        os.environ.pop("DATABASE_URL", None)
    os.environ["DJANGO_SETTINGS_MODULE"] = "pippa_site.settings"
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()


def runloop(label: str, **env: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "runloop", "--worker-id", label],
        env={**os.environ, **env},
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def wait(predicate, what: str, timeout: float = 120):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.01)
    raise SystemExit(f"timed out waiting for {what}")


def hanging_task(folder: Path) -> int:
    from loop import actions, plans
    from loop.permissions import SYSTEM

    log = folder / "runs.log"
    spec = plans.validate(
        {
            "title": "cut mid-step",
            "steps": [
                {"key": "cut", "tool": "test.record", "args": {"log": str(log), "first_sleep": 600}}
            ],
        }
    )
    return actions.create_task(plan=spec, actor="bench", user=SYSTEM).pk


def started(task_id: int) -> None:
    from loop.models import Event

    wait(
        lambda: Event.objects.filter(task_id=task_id, kind="step_started").exists(), "a first start"
    )


def restarted_at(task_id: int) -> datetime:
    from loop.models import Event

    event = wait(
        lambda: Event.objects.filter(task_id=task_id, kind="step_restarted").first(),
        "the restart",
    )
    return event.created_at


def kill(proc: subprocess.Popen[bytes]) -> float:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    return time.time()


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def finish(task_id: int) -> None:
    """The restarted attempt runs no sleep: wait until it is done, so the next round's task is
    the only one running."""
    from loop.models import Task

    wait(lambda: not Task.objects.filter(pk=task_id).open().exists(), "the task to finish")


def restart_once(folder: Path) -> tuple[float, float]:
    """(ready → restarted, kill → restarted) in seconds."""
    from loop.models import Event

    task_id = hanging_task(folder)
    first = runloop("bench-a")
    started(task_id)
    killed = kill(first)
    mark = Event.objects.order_by("-id").values_list("id", flat=True).first() or 0
    again = runloop("bench-a")
    try:
        ready = wait(
            lambda: Event.objects.filter(id__gt=mark, kind="worker_started").first(),
            "the new process",
        )
        restarted = restarted_at(task_id)
        finish(task_id)
    finally:
        stop(again)
    return (restarted - ready.created_at).total_seconds(), restarted.timestamp() - killed


def takeover_once(folder: Path, *, other_host: bool) -> float:
    from loop.models import Worker

    task_id = hanging_task(folder)
    env = {"LOOP_WORKER_HOST": "bench-elsewhere"} if other_host else {}
    doomed = runloop("bench-doomed", **env)
    started(task_id)
    live = runloop("bench-live")
    try:
        wait(
            lambda: Worker.objects.filter(label="bench-live", pid=live.pid).exists(),
            "the live worker",
        )
        time.sleep(random.uniform(0, 2))  # a kill comes at any moment of the peer's rounds
        killed = kill(doomed)
        seconds = restarted_at(task_id).timestamp() - killed
        finish(task_id)
    finally:
        stop(live)
    return seconds


def summary(values: list[float]) -> str:
    ordered = sorted(values)
    middle = len(ordered) // 2
    med = ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
    return f"median {med:6.3f} s   range {ordered[0]:.3f}–{ordered[-1]:.3f} s   (n={len(values)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--database-url", default="", help="PostgreSQL (default: SQLite in ./var)")
    options = parser.parse_args()
    (ROOT / "var").mkdir(exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="bench-recovery-", dir=ROOT / "var"))
    try:
        setup_django(folder, options.database_url)
        from django.conf import settings
        from django.core.management import call_command
        from django.db import connection

        call_command("migrate", verbosity=0)
        results: dict[str, list[float]] = {"a": [], "a-kill": [], "same": [], "other": []}
        for _ in range(options.repeat):
            ready, killed = restart_once(folder)
            results["a"].append(ready)
            results["a-kill"].append(killed)
            results["same"].append(takeover_once(folder, other_host=False))
            results["other"].append(takeover_once(folder, other_host=True))
        print(
            f"database: {connection.vendor}; lease {settings.LOOP_LEASE_SECONDS} s, heartbeat "
            f"{settings.LOOP_HEARTBEAT_SECONDS} s, dead after {settings.LOOP_WORKER_DEAD_AFTER} s, "
            f"reap every {settings.LOOP_REAP_SECONDS} s, idle poll {settings.LOOP_IDLE_SLEEP_MS} ms"
        )
        beat = settings.LOOP_HEARTBEAT_SECONDS
        print(f"(a) restart, ready → step restarted:   {summary(results['a'])}   target < 0.5 s")
        print(
            f"(a) restart, kill → step restarted:    {summary(results['a-kill'])}   (process start)"
        )
        print(f"(b) same host, kill → step restarted:  {summary(results['same'])}   target < 1 s")
        print(
            f"(b) other host, kill → step restarted: {summary(results['other'])}   "
            f"target < {2 * beat + 1} s"
        )
        url = f" --database-url {options.database_url}" if options.database_url else ""
        print(f"command: .venv/bin/python bench/recovery.py --repeat {options.repeat}{url}")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
