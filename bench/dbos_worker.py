"""One DBOS Transact process for bench/pg_throughput.py. It runs under bench/.dbos-venv's
Python (the bench installs `dbos` there; it is no dependency of the project).

    dbos_worker.py '{"db": URL, "executor": "w0", "first": 0, "last": 40, "steps": 25,
                     "kind": "noop" | "post", "url": SINK_URL, "concurrency": 8}'

Workflows `first`..`last-1`, each of `steps` @DBOS.step functions (a no-op, or a POST to the
sink on a new connection, as Pippa's http.post sends it), `concurrency` at a time (threads,
as DBOS runs workflows), on its system database in PostgreSQL. DBOS writes the workflow's
status (with its inputs) as it starts, each step's output as that step completes, and the
workflow's result at its end. Prints `ready` once launched, waits for a line on stdin, runs,
and prints {"start", "end", "steps"} (wall clock) and "cpu" (its CPU seconds) as JSON.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from dbos import DBOS

options: dict[str, Any] = json.loads(sys.argv[1])


@DBOS.step()
def noop(n: int) -> int:
    return n


@DBOS.step()
def post(flow: int, n: int) -> int:
    request = urllib.request.Request(
        options["url"],
        data=json.dumps([flow, n]).encode(),
        headers={"Content-Type": "application/json", "Idempotency-Key": f"{flow}-{n}"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        answer.read()
        return int(answer.status)


@DBOS.step()
def begin(flow: int, n: int) -> int:
    """Nothing but its checkpoint: the next step's start, durable before that step runs."""
    return n


@DBOS.workflow()
def steps(flow: int, count: int, kind: str, durable_start: bool) -> int:
    for n in range(count):
        if durable_start:
            begin(flow, n)
        post(flow, n) if kind == "post" else noop(n)
    return count


def main() -> None:
    DBOS(
        config={
            "name": "pgbench",
            "system_database_url": options["db"],
            "executor_id": options["executor"],
            "log_level": "WARNING",
        }
    )
    DBOS.launch()
    print("ready", flush=True)
    sys.stdin.readline()
    flows = range(options["first"], options["last"])
    start, cpu = time.time(), time.process_time()
    with ThreadPoolExecutor(options["concurrency"]) as pool:
        done = sum(
            pool.map(
                lambda f: steps(f, options["steps"], options["kind"], options["durable_start"]),
                flows,
            )
        )
    end, cpu = time.time(), time.process_time() - cpu
    print(json.dumps({"start": start, "end": end, "steps": done, "cpu": cpu}), flush=True)
    DBOS.destroy()


if __name__ == "__main__":
    main()
