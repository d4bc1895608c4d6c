"""What the PostgreSQL benches share: a fresh database of their own, Django set up on it, and
real `runloop` workers on it.

The server is `--pg` (default $PGBENCH_URL or postgres://postgres@127.0.0.1:5432); every
database these benches make is named `pgbench_…` and dropped and made again at the start.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
SERVER = os.environ.get("PGBENCH_URL", "postgres://postgres@127.0.0.1:5432")


def url(server: str, name: str) -> str:
    return f"{server.rstrip('/')}/{name}"


def fresh_database(server: str, name: str) -> str:
    """Drop `name` (ending its sessions) and create it empty; its URL. $PGBENCH_SUFFIX, if
    set, is added to the name, so people sharing a server do not drop each other's."""
    assert name.startswith("pgbench_"), name
    name += os.environ.get("PGBENCH_SUFFIX", "")
    with psycopg.connect(url(server, "postgres"), autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", [name]
        )
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.execute(f'CREATE DATABASE "{name}"')
    return url(server, name)


def setup_django(database_url: str, folder: Path, **extra: str) -> dict[str, str]:
    """Django on `database_url`, migrated; the environment a worker needs."""
    env = dict(os.environ)
    env.update(
        DATABASE_URL=database_url,
        PIPPA_DATA_DIR=str(folder),
        LOOP_MIN_FREE_MB="0",
        LOOP_LOG_LEVEL="WARNING",
        LOOP_IDLE_SLEEP_MS="20",
        LOOP_HTTP_ALLOW="127.0.0.1",  # the benches' sinks run here (README "Tools")
        DJANGO_SETTINGS_MODULE="pippa_site.settings",
    )
    env.update(extra)  # a bench's own settings win over these
    os.environ.update(env)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    return env


def start_workers(
    count: int, env: dict[str, str], log: Path | None = None
) -> list[subprocess.Popen[bytes]]:
    """`count` real `manage.py runloop` processes, once each has registered."""
    from loop.models import Worker

    out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115
    procs = [
        subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "runloop"],
            env=env,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        for _ in range(count)
    ]
    deadline = time.monotonic() + 120
    while Worker.objects.filter(pid__in=[p.pid for p in procs], state="running").count() < count:
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            stop(procs)
            raise SystemExit("a runloop did not start")
        time.sleep(0.05)
    return procs


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM (drain), then wait; SIGKILL what does not stop within 30 s."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def load() -> str:
    """The machine's load averages and core count, as `uptime` gives them."""
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f} on {os.cpu_count()} cores"


def median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
