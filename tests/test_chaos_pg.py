"""Chaos at scale, bounded: four real `runloop` workers on PostgreSQL, one SIGKILLed about
every 0.6 s (15 times) and started again, twenty tasks of five side-effect steps to real receivers.
Nothing is delivered twice or outside a committed `running` effect, no step is held by two
workers at once, and every task ends done with every question answered from the receivers'
records (tests/chaos_scale.py; full size: bench/chaos_pg.py). PostgreSQL only."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from .chaos_scale import run, worker_env
from .chaos_sinks import HttpSink, SmtpSink
from .conftest import process_env


@pytest.mark.slow
def test_four_workers_killed_in_turn_never_hold_a_step_twice_nor_deliver_twice(
    transactional_db: None, tmp_path: Path, processes: list[Any]
) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("chaos at scale runs on PostgreSQL (set DATABASE_URL=postgres://…)")
    seed = int(os.environ.get("CHAOS_SEED", str(random.randrange(1 << 30))))
    print(f"\nchaos seed {seed} (CHAOS_SEED={seed} repeats the plans and kill times)")
    base = process_env()
    files = tmp_path / "files"
    files.mkdir()
    with (
        SmtpSink(db_path=base["DATABASE_URL"], max_delay_ms=15) as smtp,
        HttpSink(db_path=base["DATABASE_URL"], max_delay_ms=15) as web,
    ):
        figures = run(
            worker_env({**base, "LOOP_FILE_ROOT": str(files)}, smtp, web),
            smtp,
            web,
            workers=4,
            tasks=20,
            kill_every=0.6,
            max_kills=15,
            seed=seed,
            log=tmp_path / "workers.log",
            timeout=50,
        )
    print(figures.table())
    assert figures.kills >= 5, "too few kills to mean anything"
    assert figures.unfinished == 0
    assert figures.steps_done == 20 * 5
    assert figures.duplicates == 0
    assert not figures.violations
    assert not figures.overlaps
    assert figures.emails + figures.posts == 20 * 5  # each step's effect went out once
