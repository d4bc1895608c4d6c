"""Big tasks: does a step cost the same late in a 10,000-step task as early on, with several
such tasks running together, and does the API stay quick meanwhile?

    .venv/bin/python bench/big_tasks.py [--steps 10000] [--tasks 4] [--database-url URL]

On a fresh SQLite file (or the PostgreSQL database given, which it migrates and adds to), it
creates `--tasks` echo tasks of `--steps` steps (timing each creation), starts one real
`runloop` and a real daphne, and while the worker runs the tasks, an agent (token from
`manage.py agent_token`, given the small task to drive) keeps asking the API: GET
/api/tasks/{id} of a small task, POST pause / resume of that task (its one step asks "May I do this?", so it only flips between
blocked, paused and running), and GET /api/events?after=… (the newest events). A GET of a big
task (its whole plan, by contract) is sampled now and then, and reported apart.

Per-step time is read afterwards from the journal: each task's step_done events, the mean
interval over a window of 100 steps around step 100 and around 90% of the plan (step 9,000),
per task (the tasks share the worker, so a task's step interval is the batch's commit
interval) and their ratio (target <= 1.2). API latency: p50 / p95 per request kind (target
p95 < 200 ms). The machine's load at the start and end is printed, since figures on a shared
machine are noisy.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PY = str(ROOT / ".venv/bin/python")

SETUP = """
import json, sys, time
from django.contrib.auth.models import Permission, User
from loop import actions, plans
from loop.permissions import SYSTEM
steps, tasks = int(sys.argv[-2]), int(sys.argv[-1])
user, _ = User.objects.get_or_create(username="bench")  # a PostgreSQL database may be reused
user.user_permissions.add(Permission.objects.get(codename="confirm_step"))
big, took = [], []
for n in range(tasks):
    plan = {"title": f"big {n}", "steps": [
        {"key": f"s{i}", "tool": "echo", "args": {"value": i}} for i in range(steps)]}
    began = time.perf_counter()
    big.append(actions.create_task(plan=plans.validate(plan), actor="bench", user=SYSTEM).pk)
    took.append(time.perf_counter() - began)
small = actions.create_task(plan=plans.validate({"title": "small", "steps": [
    {"key": "ask", "tool": "file.write", "args": {"path": "bench.txt", "content": "x"},
     "confirm_before": True}]}), actor="bench", user=SYSTEM).pk
print(json.dumps({"big": big, "small": small, "create_seconds": took}))
"""
GIVE = """
import sys
from loop import actions
from loop.permissions import SYSTEM
# The agent may pause and resume the small task: an agent acts on its own or given tasks.
actions.give(task_id=int(sys.argv[-2]), agent=sys.argv[-1], actor="bench", user=SYSTEM)
"""
TIMES = """
import json, sys
from loop.models import Event
ids = json.loads(sys.argv[-1])
out = {}
for task in ids:
    rows = Event.objects.filter(task_id=task, kind="step_done").order_by("id")
    out[task] = [at.timestamp() for at in rows.values_list("created_at", flat=True)]
print(json.dumps(out))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def django(env: dict[str, str], code: str, *args: str) -> str:
    script = "import django; django.setup()\n" + code
    out = subprocess.run(
        [PY, "-c", script, *args], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


class Agent:
    """The API client: one request at a time, each on a fresh connection, timed."""

    def __init__(self, port: int, token: str) -> None:
        self.port = port
        self.token = token
        self.samples: dict[str, list[float]] = {}
        self.statuses: dict[str, dict[int, int]] = {}

    def call(self, kind: str, method: str, path: str) -> Any:
        headers = {"Authorization": f"Bearer {self.token}"}
        if method == "POST":
            headers["Idempotency-Key"] = uuid.uuid4().hex
        began = time.perf_counter()
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            conn.request(method, path, body=b"" if method == "POST" else None, headers=headers)
            response = conn.getresponse()
            body = response.read()
        finally:
            conn.close()
        self.samples.setdefault(kind, []).append((time.perf_counter() - began) * 1000)
        counts = self.statuses.setdefault(kind, {})
        counts[response.status] = counts.get(response.status, 0) + 1
        return json.loads(body) if body else None

    def keep_asking(self, small: int, big: int, stop: threading.Event) -> None:
        after = 0
        n = 0
        while not stop.is_set():
            n += 1
            self.call("GET /api/tasks/{small}", "GET", f"/api/tasks/{small}")
            state = self.call("POST pause|resume {small}", "POST", f"/api/tasks/{small}/pause")
            if isinstance(state, dict) and state.get("state") == "paused":
                self.call("POST pause|resume {small}", "POST", f"/api/tasks/{small}/resume")
            events = self.call("GET /api/events?after=", "GET", f"/api/events?after={after}")
            if isinstance(events, dict) and events.get("last"):
                after = max(0, int(events["last"]) - 50)  # a reader that keeps up
            if n % 20 == 0:
                self.call("GET /api/tasks/{big} (whole plan)", "GET", f"/api/tasks/{big}")
            if self.sqlite:
                self.lock_wait()
            stop.wait(0.05)

    sqlite: str = ""  # the database file, to time the write lock's wait alone

    def lock_wait(self) -> None:
        """Where a small POST's time would go on SQLite without turns: how long a plain
        sqlite3 connection (which does not take turns, see pippa_site/sqlite_turns) waits for
        the write lock (BEGIN IMMEDIATE, then ROLLBACK)."""
        import sqlite3

        conn = sqlite3.connect(self.sqlite, timeout=30, isolation_level=None)
        try:
            began = time.perf_counter()
            conn.execute("BEGIN IMMEDIATE")
            waited = (time.perf_counter() - began) * 1000
            conn.execute("ROLLBACK")
        finally:
            conn.close()
        self.samples.setdefault("(SQLite lock wait, no turns)", []).append(waited)
        self.statuses.setdefault("(SQLite lock wait, no turns)", {}).setdefault(0, 0)


def reader(url: str) -> Any:
    """A function running one read on the bench's database, outside Django."""
    conn: Any
    if url.startswith("sqlite:"):
        import sqlite3

        conn = sqlite3.connect(url.removeprefix("sqlite:///"), timeout=30, isolation_level=None)
    else:
        import psycopg

        conn = psycopg.connect(url.replace("postgres://", "postgresql://", 1), autocommit=True)
    marks = "?" if url.startswith("sqlite:") else "%s"

    def read(sql: str, params: list[Any]) -> list[Any]:
        return list(conn.execute(sql.replace("%s", marks), params).fetchall())

    return read


def done_steps(read: Any, tasks: list[int]) -> int:
    marks = ", ".join("%s" for _ in tasks)
    found = read(
        f"SELECT COUNT(*) FROM loop_step WHERE state = 'done' AND task_id IN ({marks})", tasks
    )
    return int(found[0][0])


def cpu_seconds(pid: int) -> float:
    """user + system CPU time of the process so far."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_per_step(samples: list[tuple[int, float]], low: int, high: int) -> float:
    """CPU seconds per step between the last poll at or below `low` steps done and the first
    at or above `high`."""
    start = max((s for s in samples if s[0] <= low), default=samples[0])
    end = min((s for s in samples if s[0] >= high), default=samples[-1])
    return (end[1] - start[1]) / max(end[0] - start[0], 1)


def window_interval(times: list[float], at: int, width: int = 100) -> float:
    """Mean seconds between a task's consecutive step_done events over `width` steps around
    step `at` (1-based)."""
    lo = max(0, at - width // 2)
    hi = min(len(times) - 1, lo + width)
    return (times[hi] - times[lo]) / (hi - lo)


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, round(p * len(ordered)) - 1)]


def run(args: argparse.Namespace) -> int:
    data = Path(tempfile.mkdtemp(prefix="pippa-bench-big-"))
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="pippa_site.settings",
        PIPPA_DATA_DIR=str(data),
        DATABASE_URL=args.database_url or f"sqlite:///{data / 'pippa.sqlite3'}",
        LOOP_FILE_ROOT=str(data / "files"),
        PYTHONUNBUFFERED="1",
    )
    env.pop("REDIS_URL", None)
    manage = [PY, str(ROOT / "manage.py")]
    print(f"data: {data}  database: {env['DATABASE_URL']}")
    print(f"load average at start: {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)")
    subprocess.run([*manage, "migrate", "-v0"], cwd=ROOT, env=env, check=True)
    made = json.loads(django(env, SETUP, str(args.steps), str(args.tasks)))
    big, small = made["big"], made["small"]
    secs = ", ".join(f"{s:.2f}" for s in made["create_seconds"])
    print(f"created {args.tasks} tasks of {args.steps} steps: {secs} s each")
    name = f"bench-{uuid.uuid4().hex[:8]}"
    token = subprocess.run(
        [*manage, "agent_token", name, "--user", "bench"],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()[-1]
    django(env, GIVE, str(small), name)

    port = free_port()
    log = open(data / "server.log", "ab")  # noqa: SIM115
    daphne = subprocess.Popen(
        [str(ROOT / ".venv/bin/daphne"), "-b", "127.0.0.1", "-p", str(port)]
        + ["pippa_site.asgi:application"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    for _ in range(400):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.05)
    agent = Agent(port, token)
    if not args.database_url:
        agent.sqlite = str(data / "pippa.sqlite3")
    stop = threading.Event()
    asker = threading.Thread(target=agent.keep_asking, args=(small, big[0], stop), daemon=True)
    if not args.no_api:
        asker.start()  # daphne warms up (imports, first requests) before the worker starts
        time.sleep(3)
        agent.samples.clear()
        agent.statuses.clear()
    worker = subprocess.Popen(
        [*manage, "runloop", "--worker-id", "bench"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    began = time.monotonic()
    total = args.steps * args.tasks
    read = reader(env["DATABASE_URL"])
    cpu: list[tuple[int, float]] = []  # (steps done, the worker's CPU seconds so far)
    shown = 0.0
    try:
        while True:
            time.sleep(0.25)
            done = done_steps(read, big)
            cpu.append((done, cpu_seconds(worker.pid)))
            elapsed = time.monotonic() - began
            if elapsed - shown >= 5 or done == total:
                shown = elapsed
                print(f"  {elapsed:6.1f} s: {done} of {total} steps done")
            if done == total:
                break
            if elapsed > args.timeout:
                print(f"gave up after {args.timeout} s")
                return 1
            if worker.poll() is not None:
                print(f"the worker exited ({worker.returncode}); see {data / 'server.log'}")
                return 1
    finally:
        stop.set()
        if asker.is_alive():
            asker.join(timeout=70)
        worker.terminate()
        daphne.terminate()
        worker.wait(30)
        daphne.wait(30)
    elapsed = time.monotonic() - began
    print(f"ran {total} steps in {elapsed:.1f} s ({total / elapsed:.0f} steps/s overall)")
    print(f"load average at end: {os.getloadavg()[0]:.2f}")

    times = json.loads(django(env, TIMES, json.dumps(big)))
    early_at, late_at = min(100, args.steps // 10), args.steps * 9 // 10
    print(
        f"per-step interval of each task (mean over 100 steps around step {early_at} / {late_at}):"
    )
    ratios = []
    for task in big:
        stamps = times[str(task)]
        early = window_interval(stamps, early_at)
        late = window_interval(stamps, late_at)
        ratios.append(late / early)
        print(
            f"  task {task}: {early * 1000:6.2f} ms / {late * 1000:6.2f} ms  "
            f"ratio {late / early:.2f}"
        )
    print(f"ratio late/early: median {statistics.median(ratios):.2f} (target <= 1.2)")
    # The worker's own CPU per step, which the machine's other load barely moves: between
    # the polls around 0.5%-2.5% and 85%-95% of the plan (every task a step per commit).
    early_cpu = cpu_per_step(cpu, total * 5 // 1000, total * 25 // 1000)
    late_cpu = cpu_per_step(cpu, total * 85 // 100, total * 95 // 100)
    print(
        f"worker CPU per step: {early_cpu * 1000:.3f} ms early / {late_cpu * 1000:.3f} ms late, "
        f"ratio {late_cpu / early_cpu:.2f}"
    )
    print("API latency while the tasks ran (ms):")
    for kind, samples in agent.samples.items():
        codes = ", ".join(f"{c}x{n}" for c, n in sorted(agent.statuses[kind].items()))
        print(
            f"  {kind:<36} n={len(samples):<5} p50={statistics.median(samples):7.1f}  "
            f"p95={percentile(samples, 0.95):7.1f}  max={max(samples):7.1f}  [{codes}]"
        )
    small_kinds = [k for k in agent.samples if k.startswith(("GET", "POST")) and "whole" not in k]
    all_small = [s for k in small_kinds for s in agent.samples[k]]
    if all_small:
        print(
            f"  p95 of the small requests together: {percentile(all_small, 0.95):.1f} ms "
            "(target < 200)"
        )
    command = f".venv/bin/python bench/big_tasks.py --steps {args.steps} --tasks {args.tasks}"
    if args.database_url:
        command += f" --database-url {args.database_url}"
    print(f"reproduce: {command}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000, help="steps per task")
    parser.add_argument("--tasks", type=int, default=4, help="big tasks run together")
    parser.add_argument("--database-url", default="", help="PostgreSQL instead of a fresh SQLite")
    parser.add_argument("--timeout", type=float, default=900, help="give up after this (s)")
    parser.add_argument("--no-api", action="store_true", help="no API requests meanwhile")
    return run(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
