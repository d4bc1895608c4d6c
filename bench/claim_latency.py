"""Claim latency with an empty history and with a long one (finished tasks, their steps and
their events), and the ratio: history must not slow the claim down (target <= 1.2).

    .venv/bin/python bench/claim_latency.py [--finished 100000] [--rounds 2000] [--database-url URL]

One claim is what an idle-then-busy worker does each tick: the cheap "is anything claimable"
read, then one `claim_many` of up to LOOP_BATCH tasks, committed. A handful of runnable tasks
are claimed and given back (outside the timing) again and again, in two databases side by
side: one with only those tasks, one with the finished history bulk-inserted too. The claims
alternate between the two in blocks, each database on a connection of its own kept open, so
the machine's drift over a run (other load, the page cache, the disk) falls on both alike; the median and p95 per claim of each are printed, and
their ratio. Without --database-url two fresh SQLite files under ./var are used (WAL,
synchronous=FULL); with it (an empty PostgreSQL database) the history goes there and the
other side into `<name>_empty` beside it, made and dropped by the bench.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

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


def connections_to(names: dict[str, str]) -> dict[str, Any]:
    """A Django connection (a DatabaseWrapper, like the default's) to each database named."""
    from django.db import connections
    from django.db.utils import load_backend

    base = connections["default"].settings_dict
    wrappers = {}
    for side, name in names.items():
        settings_dict = {**base, "NAME": name}
        wrappers[side] = load_backend(settings_dict["ENGINE"]).DatabaseWrapper(
            settings_dict, "default"
        )
    return wrappers


def use(wrapper: Any) -> None:
    """Make `wrapper` Django's default connection; the other stays open as it is (its
    statements prepared, its SQLite write-ahead log where it was)."""
    from django.db import connections

    connections["default"] = wrapper


def sibling_database(database_url: str, suffix: str, *, drop: bool = False) -> str:
    """Make (or drop) the PostgreSQL database named like `database_url`'s with `suffix`."""
    import psycopg

    parts = urlsplit(database_url)
    name = parts.path.lstrip("/") + suffix
    admin = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", [name]
        )
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        if not drop:
            conn.execute(f'CREATE DATABASE "{name}"')
    return name


def stats(times: list[float]) -> tuple[float, float]:
    ordered = sorted(times)
    return ordered[len(ordered) // 2] * 1000, ordered[int(len(ordered) * 0.95)] * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--finished", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--runnable", type=int, default=8, help="tasks waiting to be claimed")
    parser.add_argument("--blocks", type=int, default=10, help="alternations between the two")
    parser.add_argument("--database-url", default="", help="PostgreSQL (default: SQLite in ./var)")
    options = parser.parse_args()
    (ROOT / "var").mkdir(exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="bench-claim-", dir=ROOT / "var"))
    try:
        setup_django(folder, options.database_url)
        from django.core.management import call_command
        from django.db import connection

        from loop.models import Event, Step, Task

        full_db = connection.settings_dict["NAME"]
        if options.database_url:
            empty_db = sibling_database(options.database_url, "_empty")
        else:
            empty_db = str(folder / "empty.sqlite3")
        sides = connections_to({"empty": empty_db, "history": full_db})
        ids = {}
        for side, wrapper in sides.items():
            use(wrapper)
            call_command("migrate", verbosity=0)
            if Task.objects.exists():
                raise SystemExit("--database-url: use an empty database (this one has tasks)")
            ids[side] = runnable(options.runnable)
        use(sides["history"])
        began = time.monotonic()
        add_history(options.finished)
        loaded = time.monotonic() - began
        counts = (Task.objects.count(), Step.objects.count(), Event.objects.count())
        if connection.vendor == "postgresql":
            for wrapper in sides.values():  # as autovacuum would, soon after such a load
                with wrapper.cursor() as cursor:
                    cursor.execute("ANALYZE")
        times: dict[str, list[float]] = {side: [] for side in sides}
        block = max(1, options.rounds // options.blocks)
        for _ in range(options.blocks):
            for side, wrapper in sides.items():
                use(wrapper)
                measure(20, ids[side])  # untimed: back into this side's pages
                times[side] += measure(block, ids[side])
        empty, full = stats(times["empty"]), stats(times["history"])
        for wrapper in sides.values():
            wrapper.close()
        print(
            f"database: {connection.vendor}; {options.runnable} runnable tasks, "
            f"{block * options.blocks} claims each, alternating in {options.blocks} blocks"
        )
        print(f"empty history:      median {empty[0]:.3f} ms   p95 {empty[1]:.3f} ms")
        print(
            f"with history:       median {full[0]:.3f} ms   p95 {full[1]:.3f} ms   "
            f"({counts[0]} tasks, {counts[1]} steps, {counts[2]} events; loaded in {loaded:.0f} s)"
        )
        print(f"ratio (median):     {full[0] / empty[0]:.2f}   target <= 1.2")
        url = f" --database-url {options.database_url}" if options.database_url else ""
        print(
            f"command: .venv/bin/python bench/claim_latency.py --finished {options.finished} "
            f"--rounds {options.rounds} --blocks {options.blocks}{url}"
        )
    finally:
        if options.database_url:
            from django.db import connection

            connection.close()
            sibling_database(options.database_url, "_empty", drop=True)
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
