"""Claim latency with an empty history and with a long one (finished tasks, their steps and
their events), and the ratio: history must not slow the claim down (target <= 1.2).

    .venv/bin/python bench/claim_latency.py [--finished 100000] [--rounds 2000] [--database-url URL]

One claim is what an idle-then-busy worker does each tick: the cheap "is anything claimable"
read, then one `claim_many` of up to LOOP_BATCH tasks, committed. A handful of runnable tasks
are claimed and given back (outside the timing) again and again; the median and p95 per
claim are printed, before and after the finished history is bulk-inserted. Without
--database-url a fresh SQLite file under ./var is used (WAL, synchronous=FULL).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def setup_django(folder: Path, database_url: str) -> None:
    os.environ["PIPPA_DATA_DIR"] = str(folder)
    os.environ["LOOP_LOG_LEVEL"] = "ERROR"
    if database_url:
        os.environ["DATABASE_URL"] = database_url
    else:
        os.environ.pop("DATABASE_URL", None)
    os.environ["DJANGO_SETTINGS_MODULE"] = "pippa_site.settings"
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()


def runnable(count: int) -> list[int]:
    from loop import actions, plans
    from loop.permissions import SYSTEM

    spec = plans.validate(
        {"title": "claim me", "steps": [{"key": "a", "tool": "echo", "args": {"value": 1}}]}
    )
    return [actions.create_task(plan=spec, actor="bench", user=SYSTEM).pk for _ in range(count)]


def measure(rounds: int, task_ids: list[int]) -> list[float]:
    from django.conf import settings
    from django.db import transaction

    from loop import lease
    from loop.models import Task

    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        if lease.any_claimable():
            with transaction.atomic():
                claimed = lease.claim_many(1, settings.LOOP_BATCH)
        times.append(time.perf_counter() - start)
        assert claimed, "nothing claimed"
        Task.objects.filter(pk__in=task_ids).update(lease_owner=None, lease_until=None)
    return times


def add_history(finished: int, *, chunk: int = 5000) -> None:
    """`finished` done tasks, each with two done steps and the events a run journals."""
    from django.db import transaction
    from django.utils import timezone

    from loop.models import Event, Step, Task

    now = timezone.now()
    made = 0
    while made < finished:
        count = min(chunk, finished - made)
        with transaction.atomic():
            tasks = Task.objects.bulk_create(
                [Task(title=f"old {made + n}", state="done", lease_epoch=2) for n in range(count)]
            )
            steps = Step.objects.bulk_create(
                [
                    Step(
                        task=t,
                        position=p,
                        key=f"s{p}",
                        tool="echo",
                        state="done",
                        attempts=1,
                        output={"value": p},
                        started_at=now,
                        finished_at=now,
                    )
                    for t in tasks
                    for p in range(2)
                ]
            )
            events = [Event(kind="task_created", task=t, actor="bench") for t in tasks]
            for s in steps:
                events.append(Event(kind="step_started", task_id=s.task_id, step=s, actor="w"))
                events.append(Event(kind="step_done", task_id=s.task_id, step=s, actor="w"))
            events += [
                Event(kind="task_state", task=t, actor="w", data={"new": "done"}) for t in tasks
            ]
            Event.objects.bulk_create(events, batch_size=2000)
        made += count


def stats(times: list[float]) -> tuple[float, float]:
    ordered = sorted(times)
    return ordered[len(ordered) // 2] * 1000, ordered[int(len(ordered) * 0.95)] * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--finished", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--runnable", type=int, default=8, help="tasks waiting to be claimed")
    parser.add_argument("--database-url", default="", help="PostgreSQL (default: SQLite in ./var)")
    options = parser.parse_args()
    (ROOT / "var").mkdir(exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="bench-claim-", dir=ROOT / "var"))
    try:
        setup_django(folder, options.database_url)
        from django.core.management import call_command
        from django.db import connection

        from loop.models import Event, Step, Task

        call_command("migrate", verbosity=0)
        if options.database_url and Task.objects.exists():
            raise SystemExit("--database-url: use an empty database (this one has tasks)")
        ids = runnable(options.runnable)
        measure(200, ids)  # warm up
        empty = stats(measure(options.rounds, ids))
        began = time.monotonic()
        add_history(options.finished)
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("ANALYZE")  # as autovacuum would, soon after such a load
        loaded = time.monotonic() - began
        measure(200, ids)
        full = stats(measure(options.rounds, ids))
        print(
            f"database: {connection.vendor}; {options.runnable} runnable tasks, "
            f"{options.rounds} claims each"
        )
        print(f"empty history:      median {empty[0]:.3f} ms   p95 {empty[1]:.3f} ms")
        print(
            f"with history:       median {full[0]:.3f} ms   p95 {full[1]:.3f} ms   "
            f"({Task.objects.count()} tasks, {Step.objects.count()} steps, "
            f"{Event.objects.count()} events; loaded in {loaded:.0f} s)"
        )
        print(f"ratio (median):     {full[0] / empty[0]:.2f}   target <= 1.2")
        url = f" --database-url {options.database_url}" if options.database_url else ""
        print(
            f"command: .venv/bin/python bench/claim_latency.py --finished {options.finished} "
            f"--rounds {options.rounds}{url}"
        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
