"""A setting from the environment that is no value it can take stops every process at start
with the setting's name and what it must be, in one line and without a traceback (manage.py and
daphne's import of the site both): never a worker that reaps every 0 s, a lease that is over
before it starts, or a retention window of `nan` days found only at the first batch. Numbers
are read in ASCII digits only (`loop.numbers`): '١٢' or '²' is no batch size."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT, process_env

# settings' refusals: database-independent, tried on the SQLite run
pytestmark = pytest.mark.sqlite_only


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("LOOP_REAP_SECONDS", "nan", "LOOP_REAP_SECONDS: must be a number from 0.05 to 3600"),
        ("LOOP_REAP_SECONDS", "0", "LOOP_REAP_SECONDS: must be a number from 0.05 to 3600"),
        ("LOOP_PRUNE_AFTER_DAYS", "inf", "LOOP_PRUNE_AFTER_DAYS: must be a number from 0 to 36500"),
        ("LOOP_RECEIPT_REPLAY_DAYS", "thirty", "LOOP_RECEIPT_REPLAY_DAYS: must be a number"),
        (
            "LOOP_LLM_TIMEOUT_SECONDS",
            "-5",
            "LOOP_LLM_TIMEOUT_SECONDS: must be a number from 0.1 to",
        ),
        ("LOOP_LEASE_SECONDS", "-30", "LOOP_LEASE_SECONDS: must be a whole number of 1 or more"),
        (
            "LOOP_HEARTBEAT_SECONDS",
            "0",
            "LOOP_HEARTBEAT_SECONDS: must be a whole number of 1 or more",
        ),
        ("LOOP_IDLE_SLEEP_MS", "-200", "LOOP_IDLE_SLEEP_MS: must be a whole number of 1 or more"),
        ("EMAIL_PORT", "70000", "EMAIL_PORT: must be a whole number from 1 to 65535"),
        ("LOOP_BATCH", "١٢", "LOOP_BATCH: must be a whole number from 1 to 256"),
        ("LOOP_BATCH", "²", "LOOP_BATCH: must be a whole number from 1 to 256"),
        ("LOOP_BATCH", " 12", "LOOP_BATCH: must be a whole number from 1 to 256"),
        ("LOOP_BATCH", "1_0", "LOOP_BATCH: must be a whole number from 1 to 256"),
        ("LOOP_REAP_SECONDS", "1e1", "LOOP_REAP_SECONDS: must be a number from 0.05 to 3600"),
        ("LOOP_REAP_SECONDS", "٣", "LOOP_REAP_SECONDS: must be a number from 0.05 to 3600"),
        ("TIME_ZONE", "Mars/Olympus", "TIME_ZONE: no time zone 'Mars/Olympus'"),
        ("LOOP_SQL_DATABASES", "shop=nope://x", "LOOP_SQL_DATABASES 'shop': not a database URL"),
        (
            "LOOP_LLM_MAX_TOKENS",
            "0",
            "LOOP_LLM_MAX_TOKENS: must be a whole number from 1 to 500000",
        ),
        ("LOOP_LLM_MAX_REPLY_BYTES", "5MB", "LOOP_LLM_MAX_REPLY_BYTES: must be a whole number"),
        (
            "LOOP_LLM_MAX_ARG_BYTES",
            "8",
            "LOOP_LLM_MAX_ARG_BYTES: must be a whole number of 16 or more",
        ),
        ("LOOP_LLM_MAX_CALLS", "-1", "LOOP_LLM_MAX_CALLS: must be a whole number from 1 to 1000"),
        ("LOOP_LLM_STEP_TOKENS", "0", "LOOP_LLM_STEP_TOKENS: must be a whole number of 1 or more"),
        (
            "LOOP_LLM_GIVE_BACKS",
            "-3",
            "LOOP_LLM_GIVE_BACKS: must be a whole number from 0 to 100000",
        ),
        (
            "LOOP_CONFIRM_PLANS",
            "sometimes",
            "LOOP_CONFIRM_PLANS: must be side_effects, always or never",
        ),
    ],
)
def test_a_setting_out_of_its_range_stops_the_process_naming_it(
    db: None, name: str, value: str, says: str
) -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "tasks"],
        capture_output=True,
        text=True,
        env=process_env(EMAIL_HOST="127.0.0.1", **{name: value}),
        timeout=60,
    )
    assert result.returncode != 0
    assert says in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().count("\n") == 0, result.stderr  # one line
    assert result.stderr.startswith("settings: ")


def test_daphne_stops_at_a_bad_setting_with_one_line(db: None) -> None:
    result = subprocess.run(
        [str(Path(sys.executable).with_name("daphne")), "-p", "0", "pippa_site.asgi:application"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=process_env(LOOP_LEASE_SECONDS="0"),
        timeout=60,
    )
    assert result.returncode != 0
    assert result.stderr.strip() == (
        "settings: LOOP_LEASE_SECONDS: must be a whole number of 1 or more, not '0'"
    ), result.stderr[-2000:]
