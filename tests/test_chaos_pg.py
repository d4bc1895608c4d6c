"""Chaos at scale, bounded: four real `runloop` workers on PostgreSQL, one SIGKILLed about
every 0.6 s (15 times) and started again, twenty tasks of five side-effect steps to real
receivers. Nothing is delivered twice or outside a committed `running` effect, no step is held
by two workers at once, no kill leaves more than one question, and every task ends done with
every question answered from the receivers' records (tests/support/chaos_scale.py; full size:
bench/chaos_pg.py). PostgreSQL only."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, transaction

from loop import journal
from loop.models import EventKind

from .conftest import make_task, process_env, step
from .support.chaos_scale import overlaps, run, worker_env
from .support.chaos_sinks import HttpSink, SmtpSink


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
            min_kills=10,
            seed=seed,
            log=tmp_path / "workers.log",
            timeout=50,
        )
    print(figures.table())
    assert figures.kills >= 10, "too few kills to mean anything"
    assert figures.unfinished == 0
    assert figures.steps_done == 20 * 5
    assert figures.duplicates == 0
    assert not figures.violations
    assert not figures.overlaps
    assert figures.emails + figures.posts == 20 * 5  # each step's effect went out once
    # One question per crash at most, and only about a worker's cut start.
    assert figures.most_from_one_kill <= 1, figures.asked_by.most_common(3)
    assert all(worker.startswith("worker:") for worker in figures.asked_by), figures.asked_by


def test_the_journal_check_finds_a_step_started_by_a_second_worker_without_a_fence(
    db: None,
) -> None:
    """The chaos run's check of the journal is no formality: a second worker's start of a
    held step is found, unless the first holder's death (or its lease's release) lies between."""
    task = make_task(step("a"), step("b"))
    a, b = task.steps.order_by("position")
    with transaction.atomic():
        journal.record(EventKind.STEP_STARTED, step=a, actor="worker:1")
        journal.record(EventKind.STEP_RESTARTED, step=a, actor="worker:2")  # no fence
        journal.record(EventKind.STEP_STARTED, step=b, actor="worker:1")
        journal.record(EventKind.WORKER_DEAD, actor="boot:x", worker=1, pid=1)
        journal.record(EventKind.STEP_RESTARTED, step=b, actor="worker:3")  # fenced
        journal.record(EventKind.STEP_DONE, step=b, actor="worker:3")
        journal.record(EventKind.STEP_DONE, step=a, actor="worker:1")  # a verdict, not held
    found = overlaps()
    assert len(found) == 2, found
    assert found[0].startswith(f"step {a.pk}: worker:2 started it")
    assert found[1].startswith(f"step {a.pk}: worker:1 gave a verdict")
