"""A worker's resident memory over 10,000 steps, read-only and then side-effect, on PostgreSQL.

    .venv/bin/python bench/memory.py [--steps 10000] [--pg postgres://postgres@127.0.0.1:5432]

For each kind a fresh `runloop` is started on database pgbench_memory, then `--steps` steps
(tasks of 25: `echo`, or `http.post` to a local sink in its own process) are created in one
commit. The worker's VmRSS (/proc/PID/status) is sampled every 0.2 s with the count of steps
done. Warm-up is the first 10% of the steps: growth is the RSS at the end minus the RSS when
the warm-up was done (target: under 10 MB).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import pg
from effect_overhead import Sink

ROOT = Path(__file__).resolve().parent.parent
PER_TASK = 25
TARGET_MB = 10.0


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def run(env: dict[str, str], kind: str, steps: int, url: str) -> dict[str, Any]:
    from django.db import transaction

    from loop import actions, plans
    from loop.models import Step
    from loop.permissions import SYSTEM

    def spec(t: int, s: int) -> dict[str, Any]:
        if kind == "read-only":
            return {"key": f"s{s}", "tool": "echo", "args": {"value": [t, s]}}
        return {"key": f"s{s}", "tool": "http.post", "args": {"url": url, "json": [t, s]}}

    [worker] = pg.start_workers(1, {**env, "LOOP_IDEMPOTENT_RECEIVERS": url})  # batched
    samples: list[tuple[float, int, float]] = []  # (seconds, steps done, RSS MB)
    began = time.monotonic()
    try:
        start = rss_mb(worker.pid)
        with transaction.atomic():
            ids = [
                actions.create_task(
                    plan=plans.validate(
                        {
                            "title": f"memory {kind} {t}",
                            "steps": [spec(t, s) for s in range(PER_TASK)],
                        }
                    ),
                    actor="bench",
                    user=SYSTEM,
                ).pk
                for t in range(steps // PER_TASK)
            ]
        mine = Step.objects.filter(task_id__in=ids, state="done")
        deadline = time.monotonic() + 900
        while True:
            done = mine.count()
            samples.append((time.monotonic() - began, done, rss_mb(worker.pid)))
            if done >= len(ids) * PER_TASK:
                break
            if time.monotonic() > deadline or worker.poll() is not None:
                raise SystemExit(f"the runloop stopped or stalled at {done} steps")
            time.sleep(0.2)
    finally:
        pg.stop([worker])
    warm = next(rss for _, done, rss in samples if done >= steps // 10)
    end = samples[-1][2]
    return {
        "kind": kind,
        "steps": len(ids) * PER_TASK,
        "seconds": round(samples[-1][0], 1),
        "samples": len(samples),
        "start_mb": round(start, 1),
        "warm_mb": round(warm, 1),
        "peak_mb": round(max(s[2] for s in samples), 1),
        "end_mb": round(end, 1),
        "growth_mb": round(end - warm, 1),
        "growth_from_start_mb": round(end - start, 1),
        "curve": [
            (round(t, 1), d, round(r, 1)) for t, d, r in samples[:: max(1, len(samples) // 12)]
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10_000, help="steps per kind")
    parser.add_argument("--kinds", default="read-only,side-effect")
    parser.add_argument("--pg", default=pg.SERVER, help="the PostgreSQL server")
    options = parser.parse_args()
    print(f"before: {pg.load()}", flush=True)
    (ROOT / "var").mkdir(exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="memory-", dir=ROOT / "var"))
    env = pg.setup_django(pg.fresh_database(options.pg, "pgbench_memory"), folder)
    sink, port = Sink.apart()
    results = []
    try:
        for kind in options.kinds.split(","):
            results.append(run(env, kind, options.steps, f"http://127.0.0.1:{port}/hook"))
            print(json.dumps(results[-1]), flush=True)
    finally:
        sink.kill()
    print(f"after: {pg.load()}")
    print(f"{'kind':11} | steps | start MB | warm MB | peak MB | end MB | growth after warm-up")
    for r in results:
        verdict = "ok" if r["growth_mb"] < TARGET_MB else f"over the {TARGET_MB:.0f} MB target"
        print(
            f"{r['kind']:11} | {r['steps']:5} | {r['start_mb']:8.1f} | {r['warm_mb']:7.1f} | "
            f"{r['peak_mb']:7.1f} | {r['end_mb']:6.1f} | {r['growth_mb']:+.1f} MB ({verdict})"
        )
    print("reproduce: .venv/bin/python bench/memory.py --steps", options.steps)


if __name__ == "__main__":
    main()
