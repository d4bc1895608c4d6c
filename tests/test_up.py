"""`bin/up` supervises its processes (issue 27): the worker SIGKILLed comes back within seconds,
logged, and stopping `bin/up` stops the worker and the server both. On a SQLite file of its own."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from .conftest import ROOT, wait_for
from .support.chaos_sinks import free_port

pytestmark = pytest.mark.sqlite_only


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"


def test_a_killed_worker_is_started_again_and_stopping_stops_both(tmp_path: Path) -> None:
    env = dict(os.environ)
    env.pop("DATABASE_URL", None)
    env.pop("REDIS_URL", None)
    env.update(PIPPA_DATA_DIR=str(tmp_path / "var"), PORT=str(free_port()))
    log = tmp_path / "up.log"
    up = subprocess.Popen(
        [str(ROOT / "bin/up"), "--no-install"],
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:

        def started(name: str) -> list[int]:
            return [int(p) for p in re.findall(rf"{name} started \(pid (\d+)\)", log.read_text())]

        [worker] = wait_for(lambda: started("worker"), timeout=90)
        [server] = wait_for(lambda: started("server"), timeout=30)
        os.kill(worker, signal.SIGKILL)
        t0 = time.monotonic()
        again = wait_for(lambda: started("worker")[1:], timeout=10)[0]
        back_in = time.monotonic() - t0
        print(f"\nthe worker SIGKILLed under bin/up was running again in {back_in:.2f} s")
        assert back_in < 5
        assert alive(again) and not alive(worker)
        assert f"worker (pid {worker}) exited with code 137" in log.read_text()
        # bin/up names the pid as it forks; the fork becomes the worker when it execs, a moment on.
        cmdline = Path(f"/proc/{again}/cmdline")
        wait_for(lambda: "manage.py runloop" in cmdline.read_text().replace("\0", " "), timeout=10)

        up.send_signal(signal.SIGTERM)
        assert up.wait(timeout=30) == 0
        wait_for(lambda: not alive(again) and not alive(server), timeout=15)
        assert started("worker") == [worker, again]  # not started a third time while stopping
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait()
