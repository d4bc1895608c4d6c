"""The nemesis, bounded (tests/support/nemesis.py; full size and with real PostgreSQL and
Redis restarts: bench/nemesis.py): three real workers on PostgreSQL, two in network namespaces
of their own, one with its clock off, under a random schedule of partitions, SIGSTOP pauses
and database outages. No effect arrives twice without a person's "do it", no step is held by
two workers at once, every task ends done or waiting on Dad, and every question Dad got was
about a step whose holder was under a fault.

The PostgreSQL server and Redis here are shared with other people's test runs: this module
does not restart them (a restart ends every session on the server, failing their tests mid-
transaction, however short it is). The database outage is the forwarder the workers reach
PostgreSQL through cutting their connections and refusing new ones, a restart as they see it;
the bench restarts the real servers. PostgreSQL only; root for `ip netns` (here and in CI)."""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import pytest
from django.db import connection
from django.test import override_settings

from .conftest import process_env
from .support.chaos_sinks import HttpSink
from .support.nemesis import Nemesis, Network, one_run, table
from .support.skew import libfaketime

pytestmark = [pytest.mark.slow]
RECEIVERS = ["127.0.0.1", "198.18.0.0/15"]  # this host, and as the network namespaces see it


def test_three_workers_under_partitions_pauses_clock_skew_and_outages(
    transactional_db: None, tmp_path: Path
) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the nemesis runs on PostgreSQL (set DATABASE_URL=postgres://…)")
    if os.geteuid() != 0 or not shutil.which("ip") or not libfaketime():
        pytest.fail("the nemesis needs root, iproute2 and faketime (bin/install --test)")
    seed = int(os.environ.get("NEMESIS_SEED", str(random.randrange(1 << 30))))
    print(f"\nnemesis seed {seed} (NEMESIS_SEED={seed} repeats it)")
    db = connection.settings_dict
    env = process_env(
        NEMESIS_DATABASE_URL=f"postgres://{db['USER']}@{{host}}:{{port}}/{db['NAME']}",
        NEMESIS_PG_PORT=str(db["PORT"] or 5432),
        LOOP_HEARTBEAT_SECONDS="1",
        LOOP_WORKER_DEAD_AFTER="3",
        LOOP_LEASE_SECONDS="3",
        LOOP_REAP_SECONDS="0.2",
        LOOP_HTTP_TIMEOUT="5",
        LOOP_RETRY_BASE_SECONDS="0",
        LOOP_IDLE_SLEEP_MS="20",
        LOOP_MIN_FREE_MB="0",
        LOOP_LOG_LEVEL="WARNING",
        # The receiver listens where the namespaced workers reach this host.
        LOOP_HTTP_ALLOW=",".join(RECEIVERS),
    )
    tag = f"pn{os.getpid() % 10000}"
    with (
        override_settings(LOOP_HTTP_ALLOW=RECEIVERS),
        Network(tag) as net,
        HttpSink(
            db_path=env["DATABASE_URL"], max_delay_ms=300, bind="0.0.0.0", url_host=net.hosts[0]
        ) as web,  # noqa: S104
    ):
        env["LOOP_HTTP_PROBE_URL"] = web.url("/probe/{key}")
        nemesis = Nemesis(env, net, web, tmp_path / "workers.log")
        try:
            run = one_run(nemesis, seed=seed, tasks=8, fault_seconds=10)
        finally:
            nemesis.close()
    print(table([run]))
    for problem in [*run.duplicates, *run.double_holds, *run.unneeded, *run.stuck, *run.wrong]:
        print("PROBLEM:", problem)
    assert len(run.faults) >= 3, "too few faults to mean anything"
    assert run.steps_done == 8 * 3
    assert not run.duplicates
    assert not run.double_holds
    assert not run.stuck
    assert not run.wrong
    assert not run.unneeded
