"""Steps per second on PostgreSQL with 1, 2 and 4 worker processes, read-only and side-effect,
for Pippa (real `runloop` processes) and for DBOS Transact on the same server, and their ratio.

    .venv/bin/python bench/pg_throughput.py [--rounds 3] [--workers 1,2,4] [--quick]
                                            [--pg postgres://postgres@127.0.0.1:5432]

The workload is the same for both, with every step's start durable before the step runs:
`--tasks` tasks (DBOS: workflows) of `--steps` steps each; a read-only step does nothing (Pippa:
`echo`; DBOS: a no-op @DBOS.step), a side-effect step POSTs to a local HTTP sink started here
in its own process (Pippa: `http.post`; DBOS: a @DBOS.step that POSTs with urllib, a new
connection each, as `http.post` does). Pippa commits each step's start before it runs (and a
side effect's intent and claim before it is sent). DBOS checkpoints a step's output only once
the step has completed, so its step is preceded by a @DBOS.step that does nothing but be
checkpointed: the step's start, durable before the step runs, which is how a DBOS program
makes a start durable. Beside it, DBOS as it comes ("outputs only": no durable start, so a
step cut by a crash runs again unasked) is measured too, and both ratios are printed. The
sink is listed in LOOP_IDEMPOTENT_RECEIVERS (it gets an Idempotency-Key), so a
Pippa worker sends up to LOOP_BATCH_EFFECTS effects at once; `--unlisted`: one at a time, as
for a receiver whose cut would ask Dad.

Pippa: the workers are started and registered first, then all tasks are created in one commit;
the rate is the tasks' steps over first `step_started` to last `step_done` in the journal.
Each worker takes up to LOOP_BATCH (`--batch`, 8) tasks at a time. DBOS: the workflows are
split evenly between the processes, each running `--batch` at a time (threads); each process
launches, says it is ready, and starts when all are; the rate is all steps over the first
start to the last end. Each configuration runs `--rounds` times, interleaved (so a burst of
load on the shared machine hits every system alike); the table gives the median and the range,
and the workers' CPU time per step (Pippa: /proc of each runloop; DBOS: each process's own).
`--explain` splits a Pippa step's time on PostgreSQL instead (commits, SQL, effects, Python).

DBOS 3.4.0 is installed by this script into bench/.dbos-venv (git-ignored) on first use: it is
not a dependency of the project. Databases: pgbench_pippa and pgbench_dbos, dropped and made
again at the start (--explain: pgbench_explain).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pg
from effect_overhead import Sink, split_ticks

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / "bench" / ".dbos-venv"
DBOS_VERSION = "3.4.0"
KINDS = ("read-only", "side-effect")
# DBOS with each step's start checkpointed before it runs (the workload Pippa runs), and as it
# comes, checkpointing only each step's output.
SYSTEMS = {"pippa": "Pippa", "dbos": "DBOS, start durable", "dbos-outputs": "DBOS, outputs only"}
UNLISTED = [False]  # --unlisted: the sink not in LOOP_IDEMPOTENT_RECEIVERS
BATCH = [8]  # steps in flight per worker: LOOP_BATCH (and _EFFECTS), DBOS threads per process
CPU_MS: dict[tuple[str, str, int], list[float]] = {}  # the workers' CPU time per step


def dbos_python() -> Path:
    """bench/.dbos-venv's Python, with dbos==DBOS_VERSION installed (made here if missing)."""
    python = VENV / "bin" / "python"
    check = [str(python), "-c", "import importlib.metadata as m; print(m.version('dbos'))"]
    if python.exists():
        found = subprocess.run(check, capture_output=True, text=True)
        if found.returncode == 0 and found.stdout.strip() == DBOS_VERSION:
            return python
    print(f"installing dbos=={DBOS_VERSION} into {VENV} …", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", f"dbos=={DBOS_VERSION}"], check=True)
    return python


def pippa_rate(
    env: dict[str, str], kind: str, workers: int, tasks: int, steps: int, url: str
) -> float:
    from django.db import transaction
    from django.db.models import Max, Min

    from loop import actions, plans
    from loop.models import Event, Task
    from loop.permissions import SYSTEM

    def spec(t: int, s: int) -> dict[str, Any]:
        if kind == "read-only":
            return {"key": f"s{s}", "tool": "echo", "args": {"value": s}}
        return {"key": f"s{s}", "tool": "http.post", "args": {"url": url, "json": [t, s]}}

    listed = "" if UNLISTED[0] else url  # a receiver that dedupes: effects batch (see above)
    procs = pg.start_workers(workers, {**env, "LOOP_IDEMPOTENT_RECEIVERS": listed})
    idle = [cpu_seconds(p.pid) for p in procs]
    try:
        with transaction.atomic():  # one commit: the idle workers find all of them at once
            ids = [
                actions.create_task(
                    plan=plans.validate(
                        {"title": f"bench {t}", "steps": [spec(t, s) for s in range(steps)]}
                    ),
                    actor="bench",
                    user=SYSTEM,
                ).pk
                for t in range(tasks)
            ]
        deadline = time.monotonic() + 600
        while Task.objects.filter(pk__in=ids).open().exists():
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise SystemExit("the runloops stopped or stalled")
            time.sleep(0.05)
        cpu = sum(cpu_seconds(p.pid) - before for p, before in zip(procs, idle, strict=True))
    finally:
        pg.stop(procs)
    events = Event.objects.filter(task_id__in=ids)
    done = events.filter(kind="step_done").count()
    assert done == tasks * steps, (done, tasks * steps)
    span = events.filter(kind__in=["step_started", "step_done"]).aggregate(
        first=Min("created_at"), last=Max("created_at")
    )
    CPU_MS.setdefault(("pippa", kind, workers), []).append(cpu / done * 1000)
    return done / (span["last"] - span["first"]).total_seconds()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def dbos_rate(
    python: Path,
    db: str,
    kind: str,
    workers: int,
    tasks: int,
    steps: int,
    url: str,
    *,
    durable_start: bool,
) -> float:
    share = [tasks // workers + (1 if w < tasks % workers else 0) for w in range(workers)]
    procs = []
    first = 0
    for w, count in enumerate(share):
        options = {
            "db": db,
            "executor": f"bench-{w}",
            "first": first,
            "last": first + count,
            "steps": steps,
            "kind": "post" if kind == "side-effect" else "noop",
            "url": url,
            "concurrency": BATCH[0],
            "durable_start": durable_start,
        }
        first += count
        procs.append(
            subprocess.Popen(
                [str(python), str(ROOT / "bench" / "dbos_worker.py"), json.dumps(options)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
        )
    try:
        for proc in procs:
            assert proc.stdout and proc.stdout.readline().strip() == "ready", "DBOS did not launch"
        for proc in procs:
            assert proc.stdin
            proc.stdin.write("go\n")
            proc.stdin.flush()
        results = []
        for proc in procs:
            assert proc.stdout
            results.append(json.loads(proc.stdout.readline()))
            proc.wait(timeout=60)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    done = sum(r["steps"] for r in results)
    assert done == tasks * steps, (done, tasks * steps)
    system = "dbos" if durable_start else "dbos-outputs"
    CPU_MS.setdefault((system, kind, workers), []).append(
        sum(r["cpu"] for r in results) / done * 1000
    )
    return done / (max(r["end"] for r in results) - min(r["start"] for r in results))


def explain(kind: str, url: str, tasks: int = 16, steps: int = 25) -> dict[str, Any]:
    """Where a Pippa step's time goes, in an in-process worker on the bench's database: the
    commits, the SQL executed, the side effects performed (their HTTP round trips) and the
    rest (Python); with statements and commits per step, and CPU time per step."""
    from django.conf import settings
    from django.db import transaction

    from loop import actions, plans
    from loop.models import Event
    from loop.permissions import SYSTEM
    from loop.worker import Worker

    def spec(t: int, s: int) -> dict[str, Any]:
        if kind == "read-only":
            return {"key": f"s{s}", "tool": "echo", "args": {"value": s}}
        return {"key": f"s{s}", "tool": "http.post", "args": {"url": url, "json": [t, s]}}

    with transaction.atomic():
        ids = [
            actions.create_task(
                plan=plans.validate(
                    {"title": f"explain {t}", "steps": [spec(t, s) for s in range(steps)]}
                ),
                actor="bench",
                user=SYSTEM,
            ).pk
            for t in range(tasks)
        ]
    settings.LOOP_IDEMPOTENT_RECEIVERS = [] if UNLISTED[0] else [url]  # as the workers have it
    runner = Worker(label="explain")
    runner.boot()
    done = Event.objects.filter(kind="step_done", task_id__in=ids)
    return {"kind": kind, **split_ticks(runner, done)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", default="1,2,4", help="worker processes, comma-separated")
    parser.add_argument("--tasks", type=int, default=64, help="tasks (workflows) per run")
    parser.add_argument("--steps", type=int, default=100, help="read-only steps per task")
    parser.add_argument("--effect-steps", type=int, default=20, help="side-effect steps per task")
    parser.add_argument(
        "--quick", action="store_true", help="32 tasks of 40 read-only or 8 side-effect steps"
    )
    parser.add_argument("--pg", default=pg.SERVER, help="the PostgreSQL server")
    parser.add_argument(
        "--batch",
        type=int,
        default=8,
        help="steps in flight per worker: LOOP_BATCH and LOOP_BATCH_EFFECTS; DBOS threads",
    )
    parser.add_argument(
        "--unlisted",
        action="store_true",
        help="the sink not in LOOP_IDEMPOTENT_RECEIVERS: Pippa sends one effect at a time",
    )
    parser.add_argument(
        "--kinds", default=",".join(KINDS), help="the kinds of steps to measure, comma-separated"
    )
    parser.add_argument(
        "--explain", action="store_true", help="only split a Pippa step's time, in process"
    )
    options = parser.parse_args()
    kinds = [kind for kind in KINDS if kind in options.kinds.split(",")]
    if options.explain:
        UNLISTED[0] = options.unlisted
        (ROOT / "var").mkdir(exist_ok=True)
        folder = Path(tempfile.mkdtemp(prefix="pg-explain-", dir=ROOT / "var"))
        pg.setup_django(pg.fresh_database(options.pg, "pgbench_explain"), folder)
        sink, port = Sink.apart()
        try:
            for kind in kinds:
                print(json.dumps(explain(kind, f"http://127.0.0.1:{port}/hook")), flush=True)
        finally:
            sink.kill()
            shutil.rmtree(folder, ignore_errors=True)
        return
    if options.quick:
        options.tasks, options.steps, options.effect_steps = 32, 40, 8
    counts = [int(w) for w in options.workers.split(",")]
    steps = {"read-only": options.steps, "side-effect": options.effect_steps}
    if not kinds:
        raise SystemExit(f"--kinds: one or more of {', '.join(KINDS)}")
    python = dbos_python()
    print(f"before: {pg.load()}", flush=True)
    sink, port = Sink.apart()
    url = f"http://127.0.0.1:{port}/hook"
    (ROOT / "var").mkdir(exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="pg-throughput-", dir=ROOT / "var"))
    rates: dict[tuple[str, str, int], list[float]] = {}
    try:
        BATCH[0], UNLISTED[0] = options.batch, options.unlisted
        env = pg.setup_django(
            pg.fresh_database(options.pg, "pgbench_pippa"),
            folder,
            LOOP_BATCH=str(options.batch),
            LOOP_BATCH_EFFECTS=str(options.batch),
        )
        dbos_db = pg.fresh_database(options.pg, "pgbench_dbos")
        # DBOS makes its tables
        dbos_rate(python, dbos_db, "read-only", 1, 1, 1, url, durable_start=True)
        for n in range(options.rounds):
            for kind in kinds:
                for workers in counts:
                    for system in SYSTEMS:
                        if system == "pippa":
                            rate = pippa_rate(env, kind, workers, options.tasks, steps[kind], url)
                        else:
                            rate = dbos_rate(
                                *(python, dbos_db, kind, workers, options.tasks, steps[kind], url),
                                durable_start=system == "dbos",
                            )
                        rates.setdefault((system, kind, workers), []).append(rate)
                        print(
                            f"round {n + 1}: {system:12} {kind:11} {workers} worker(s) "
                            f"{rate:8.1f} steps/s   ({pg.load()})",
                            flush=True,
                        )
    finally:
        sink.kill()
        shutil.rmtree(folder, ignore_errors=True)
    report(rates, counts, kinds, options, steps)


def report(
    rates: dict[tuple[str, str, int], list[float]],
    counts: list[int],
    kinds: list[str],
    options: argparse.Namespace,
    steps: dict[str, int],
) -> None:
    def cell(values: list[float]) -> str:
        return f"{pg.median(values):.1f} ({min(values):.0f}–{max(values):.0f})"

    def ratio(kind: str, workers: int, system: str) -> float:
        ours, theirs = rates[("pippa", kind, workers)], rates[(system, kind, workers)]
        return pg.median(ours) / pg.median(theirs)

    print()
    print(f"after: {pg.load()}")
    print(
        f"steps/s, median (range) of {options.rounds} runs; {options.tasks} tasks x "
        f"{steps['read-only']} read-only / {steps['side-effect']} side-effect steps per run; "
        f"{BATCH[0]} steps in flight per worker (Pippa LOOP_BATCH, DBOS threads per process); "
        f"DBOS {DBOS_VERSION}"
    )
    head = (
        f"{'workers':>7} | {'kind':11} | "
        + " | ".join(f"{label:>22}" for label in SYSTEMS.values())
        + " | Pippa / DBOS: start durable (target 2x), outputs only"
        + " | CPU ms/step in the workers"
    )
    print(head)
    print("-" * len(head))
    figures: dict[str, Any] = {}
    for kind in kinds:
        for workers in counts:
            durable, outputs = ratio(kind, workers, "dbos"), ratio(kind, workers, "dbos-outputs")
            cpu = ", ".join(
                f"{pg.median(CPU_MS[(system, kind, workers)]):.2f}" for system in SYSTEMS
            )
            print(
                f"{workers:>7} | {kind:11} | "
                + " | ".join(f"{cell(rates[(s, kind, workers)]):>22}" for s in SYSTEMS)
                + f" | {durable:5.2f}x {'(met)' if durable >= 2 else '(MISSED)':8}"
                + f" {outputs:5.2f}x {'(>= 2x)' if outputs >= 2 else '(< 2x)':7} | {cpu}"
            )
            figures[f"{kind} {workers}"] = {
                **{s: [round(r, 1) for r in rates[(s, kind, workers)]] for s in SYSTEMS},
                "ratio_start_durable": round(durable, 2),
                "ratio_outputs_only": round(outputs, 2),
            }
    print("(CPU ms/step: " + ", ".join(SYSTEMS.values()) + ")")
    for kind in kinds:
        one, most = rates[("pippa", kind, min(counts))], rates[("pippa", kind, max(counts))]
        verdict = ">=" if pg.median(most) >= pg.median(one) else "<"
        print(
            f"Pippa {kind}: {max(counts)} workers {pg.median(most):.1f} {verdict} "
            f"{min(counts)} worker {pg.median(one):.1f} steps/s"
        )
    print(json.dumps(figures))
    print(
        "reproduce: .venv/bin/python bench/"
        + " ".join(Path(a).name if i == 0 else a for i, a in enumerate(sys.argv))
    )


if __name__ == "__main__":
    main()
