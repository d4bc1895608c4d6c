"""A setting from the environment that is no value it can take stops every process at start
with the setting's name and what it must be: never a worker that reaps every 0 s, a lease
that is over before it starts, or a retention window of `nan` days found only at the first
batch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from .conftest import ROOT, process_env


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("LOOP_REAP_SECONDS", "nan", "LOOP_REAP_SECONDS must be between 0.05 and 3600"),
        ("LOOP_REAP_SECONDS", "0", "LOOP_REAP_SECONDS must be between 0.05 and 3600"),
        ("LOOP_PRUNE_AFTER_DAYS", "inf", "LOOP_PRUNE_AFTER_DAYS must be between 0 and 36500"),
        ("LOOP_RECEIPT_REPLAY_DAYS", "thirty", "LOOP_RECEIPT_REPLAY_DAYS must be a number"),
        ("LOOP_LLM_TIMEOUT_SECONDS", "-5", "LOOP_LLM_TIMEOUT_SECONDS must be between 0.1 and"),
        ("LOOP_LEASE_SECONDS", "-30", "LOOP_LEASE_SECONDS must be 1 or more"),
        ("LOOP_HEARTBEAT_SECONDS", "0", "LOOP_HEARTBEAT_SECONDS must be 1 or more"),
        ("LOOP_IDLE_SLEEP_MS", "-200", "LOOP_IDLE_SLEEP_MS must be 1 or more"),
        ("EMAIL_PORT", "70000", "EMAIL_PORT must be between 1 and 65535"),
        ("LOOP_LLM_MAX_TOKENS", "0", "LOOP_LLM_MAX_TOKENS must be between 1 and 500000"),
        ("LOOP_LLM_MAX_REPLY_BYTES", "5MB", "LOOP_LLM_MAX_REPLY_BYTES must be a whole number"),
        ("LOOP_LLM_MAX_ARG_BYTES", "8", "LOOP_LLM_MAX_ARG_BYTES must be 16 or more"),
        ("LOOP_LLM_MAX_CALLS", "-1", "LOOP_LLM_MAX_CALLS must be between 1 and 1000"),
        ("LOOP_LLM_STEP_TOKENS", "0", "LOOP_LLM_STEP_TOKENS must be 1 or more"),
        ("LOOP_LLM_GIVE_BACKS", "-3", "LOOP_LLM_GIVE_BACKS must be between 0 and 100000"),
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
    assert repr(value) in result.stderr
