"""The nemesis, full size (tests/support/nemesis.py; bounded in the suite: tests/test_nemesis.py):
three real workers on PostgreSQL, two in network namespaces of their own (and pid namespaces:
only heartbeats tell whether they live), one per run with its clock 5-30 s off (libfaketime),
under a random schedule of partitions, SIGSTOP pauses, database outages (every worker's
connections cut), and real PostgreSQL and Redis restarts (`pg_ctlcluster … stop -m fast`,
`redis-cli shutdown`; both are started again whatever happens). The workers are given that
Redis as REDIS_URL, as an operator's are. Prints a table over the runs: faults, duplicate
deliveries, steps held twice, questions, unneeded questions, stuck tasks.

    .venv/bin/python bench/nemesis.py [--runs 20] [--tasks 12] [--fault-seconds 15]
                                      [--seed N] [--no-restarts] [--shared-servers]

Root, iproute2 and faketime (bin/install --test), Debian's postgresql-common (pg_createcluster).
By default the bench makes a PostgreSQL cluster and a Redis of its own (ports 5439 and 6389),
removed at the end, so its restarts end nobody else's sessions; `--shared-servers` restarts
the machine's own (127.0.0.1:5432 and :6379 — everyone's sessions end too, each outage 1-3 s).
Database pgbench_nemesis (+ $PGBENCH_SUFFIX); each run starts from an empty one. Exits
non-zero if any check failed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

import pg

ROOT = Path(__file__).resolve().parent.parent
ALLOW = "127.0.0.1,198.18.0.0/15"  # the receiver: this host, as the network namespaces see it


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--tasks", type=int, default=12, help="tasks of 3 steps per run")
    parser.add_argument("--fault-seconds", type=float, default=15)
    parser.add_argument("--seed", type=int, default=random.randrange(1 << 30))
    parser.add_argument("--no-restarts", action="store_true", help="never restart the servers")
    parser.add_argument(
        "--shared-servers",
        action="store_true",
        help="restart the machine's PostgreSQL (5432) and Redis (6379), not servers of its own",
    )
    options = parser.parse_args()
    # A SIGTERM ends it through its `finally`s: workers stopped, namespaces gone, servers up.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    (ROOT / "var").mkdir(exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="nemesis-", dir=ROOT / "var"))
    sys.path.insert(0, str(ROOT))
    from tests.support import servers as made

    with contextlib.ExitStack() as stack:
        if options.shared_servers:
            servers = made.SHARED
        else:
            servers = stack.enter_context(made.own_servers(5439, 6389, folder))
        ok = bench(options, folder, servers)
    sys.exit(0 if ok else 1)


def bench(options: argparse.Namespace, folder: Path, servers: Any) -> bool:
    from tests.support import servers as made

    server = f"postgres://postgres@127.0.0.1:{servers.pg_port}"
    database = pg.fresh_database(server, "pgbench_nemesis")
    name = database.rsplit("/", 1)[1]
    # The receiver listens where the namespaced workers reach this host (198.18.0.0/15).
    base = pg.setup_django(database, folder, PYTHONUNBUFFERED="1", LOOP_HTTP_ALLOW=ALLOW)
    from django.core.management import call_command

    from tests.support import nemesis
    from tests.support.chaos_sinks import HttpSink

    env = {
        **base,
        "NEMESIS_DATABASE_URL": f"postgres://postgres@{{host}}:{{port}}/{name}",
        "NEMESIS_PG_PORT": str(servers.pg_port),
        "NEMESIS_REDIS_URL": f"redis://{{host}}:{servers.redis_port}/0",
        "LOOP_HEARTBEAT_SECONDS": "1",
        "LOOP_WORKER_DEAD_AFTER": "3",
        "LOOP_LEASE_SECONDS": "3",
        "LOOP_REAP_SECONDS": "0.2",
        "LOOP_HTTP_TIMEOUT": "5",
        "LOOP_RETRY_BASE_SECONDS": "0",
        "LOOP_LOG_LEVEL": "WARNING",
    }
    rng = random.Random(options.seed)
    runs = []
    try:
        with nemesis.Network(f"pb{os.getpid() % 10000}") as net:
            for n in range(options.runs):
                call_command("flush", interactive=False, verbosity=0)
                with HttpSink(
                    db_path=database,
                    max_delay_ms=300,
                    bind="0.0.0.0",
                    url_host=net.hosts[0],  # noqa: S104
                ) as web:
                    env["LOOP_HTTP_PROBE_URL"] = web.url("/probe/{key}")
                    runner = nemesis.Nemesis(
                        env,
                        net,
                        web,
                        folder / f"run{n + 1}.log",
                        restarts=not options.no_restarts,
                        servers=servers,
                    )
                    try:
                        run = nemesis.one_run(
                            runner,
                            seed=rng.randrange(1 << 30),
                            tasks=options.tasks,
                            fault_seconds=options.fault_seconds,
                        )
                    finally:
                        runner.close()
                runs.append(run)
                print(nemesis.table([run]).splitlines()[2], flush=True)
                for problem in [
                    *run.duplicates,
                    *run.double_holds,
                    *run.unneeded,
                    *run.stuck,
                    *run.wrong,
                ]:
                    print("  PROBLEM:", problem, flush=True)
    finally:
        made.ensure_postgres(servers)  # whatever happened: the servers are left running
        made.ensure_redis(servers)
    print()
    print(nemesis.table(runs))
    print(
        f"reproduce: .venv/bin/python bench/nemesis.py --runs {options.runs} --tasks {options.tasks} "
        f"--fault-seconds {options.fault_seconds} --seed {options.seed}"
        f"{' --no-restarts' if options.no_restarts else ''}"
        f"{' --shared-servers' if options.shared_servers else ''}"
    )
    return all(run.ok for run in runs)


if __name__ == "__main__":
    main()
