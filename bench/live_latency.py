"""Live latency: from a change committed in the worker process to that change in Chromium's
DOM, on the home page (the task's progress row), p50 and p95 over >= 200 changes.

    .venv/bin/python bench/live_latency.py [--steps 220] [--redis redis://127.0.0.1:6379/9]

Runs twice on fresh data dirs: the embedded default (SQLite + the in-memory channel layer) and
with Redis (channels_redis). Each run starts a real daphne and a real `runloop`. A task of
`sleep 0.04` steps makes one change every ~50 ms; for the k-th step_done event the latency is
the moment the page first shows "k of N steps done" (a MutationObserver, epoch ms) minus the
event's created_at (written just before its commit, so the figure slightly overstates). Both
clocks are this machine's.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PY = str(ROOT / ".venv/bin/python")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SETUP = """
import json, sys
from django.contrib.auth.models import Permission, User
u = User.objects.create_user("dad", password="bench-password-1")
u.user_permissions.add(Permission.objects.get(codename="confirm_step"))
"""
PLAN = """
import json, sys
from loop import actions, plans
from loop.permissions import SYSTEM
n = int(sys.argv[-1])
steps = [{"key": f"s{i}", "tool": "sleep", "args": {"seconds": 0.04}} for i in range(n)]
task = actions.create_task(plan=plans.validate({"title": "bench", "steps": steps}), actor="bench", user=SYSTEM)
print(task.pk)
"""
TIMES = """
import json, sys
from loop.models import Event
task = int(sys.argv[-1])
rows = Event.objects.filter(task_id=task, kind="step_done").order_by("id")
print(json.dumps([e.created_at.timestamp() * 1000 for e in rows]))
"""
OBSERVE = """
(taskId) => {
  window.__seen = {};
  const look = () => {
    const row = document.getElementById("task-row-" + taskId);
    if (!row) return;
    const done = row.dataset.done;
    if (!(done in window.__seen)) window.__seen[done] = performance.timeOrigin + performance.now();
  };
  new MutationObserver(look).observe(document.body, {childList: true, subtree: true});
  look();
}
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


def run(mode: str, redis_url: str, steps: int) -> list[float]:
    data = Path(tempfile.mkdtemp(prefix=f"pippa-bench-{mode}-"))
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="pippa_site.settings",
        PIPPA_DATA_DIR=str(data),
        DATABASE_URL=f"sqlite:///{data / 'pippa.sqlite3'}",
        LOOP_IDLE_SLEEP_MS="20",
        PYTHONUNBUFFERED="1",
    )
    env.pop("REDIS_URL", None)
    if redis_url:
        env["REDIS_URL"] = redis_url
    manage = [PY, str(ROOT / "manage.py")]
    subprocess.run([*manage, "migrate", "-v0"], cwd=ROOT, env=env, check=True)
    subprocess.run([*manage, "collectstatic", "--noinput", "-v0"], cwd=ROOT, env=env, check=True)
    django(env, SETUP)
    port = free_port()
    log = open(data / "server.log", "ab")  # noqa: SIM115
    daphne = subprocess.Popen(
        [
            str(ROOT / ".venv/bin/daphne"),
            "-b",
            "127.0.0.1",
            "-p",
            str(port),
            "pippa_site.asgi:application",
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    worker = subprocess.Popen(
        [*manage, "runloop"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    from playwright.sync_api import sync_playwright

    try:
        for _ in range(200):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.05)
        site = f"http://127.0.0.1:{port}"
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
            page = browser.new_page()
            page.goto(site + "/accounts/login/?next=/")
            page.fill("input[name=username]", "dad")
            page.fill("input[name=password]", "bench-password-1")
            page.click("button[type=submit]")
            page.wait_for_url(site + "/")
            live_open(page)
            task_id = int(django(env, PLAN, str(steps)))
            page.evaluate(OBSERVE, task_id)
            # The last step_done also finishes the task, which then leaves "Running".
            page.wait_for_selector(f"#recent-{task_id}", state="attached", timeout=steps * 1000)
            seen = page.evaluate("window.__seen")
            browser.close()
        committed = json.loads(django(env, TIMES, str(task_id)))
        return [seen[str(k + 1)] - at for k, at in enumerate(committed) if str(k + 1) in seen]
    finally:
        worker.terminate()
        daphne.terminate()
        worker.wait(10)
        daphne.wait(10)


def live_open(page: Any) -> None:
    # A selector, not wait_for_function: that evaluates a string, which the CSP forbids.
    page.locator("body[data-live='open']").wait_for(state="attached")


def report(mode: str, samples: list[float]) -> None:
    ordered = sorted(samples)
    p50 = statistics.median(ordered)
    p95 = ordered[max(0, round(0.95 * len(ordered)) - 1)]
    print(
        f"{mode:<34} n={len(ordered):<4} p50={p50:6.1f} ms  p95={p95:6.1f} ms  max={ordered[-1]:6.1f} ms"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=220)
    parser.add_argument(
        "--redis", default=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/9")
    )
    args = parser.parse_args()
    results = [
        ("embedded (SQLite + in-memory layer)", run("embedded", "", args.steps)),
        ("Redis channel layer", run("redis", args.redis, args.steps)),
    ]
    print(f"commit in the worker -> change in Chromium's DOM ({args.steps} step changes each)")
    for mode, samples in results:
        report(mode, samples)
    return 0


if __name__ == "__main__":
    sys.exit(main())
