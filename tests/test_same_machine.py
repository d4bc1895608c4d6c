"""The same machine is the kernel's boot id and the pid namespace, not the host name (DESIGN.md
§9, issue 23): only a peer that shares both reads a worker's pid; to any other only the
heartbeat tells. Two live workers with one host name in two pid namespaces (containers,
clones) never declare each other dead while both beat — here two real `runloop`s, each pid 1
of its own namespace (`unshare --pid --fork --mount-proc`; the tests run as root)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from loop import boot
from loop.models import Event, EventKind, Task
from loop.models import Worker as WorkerRow

from .conftest import ROOT, make_task, process_env, step, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def row(**fields: str) -> WorkerRow:
    defaults = {"host": "box", "boot_id": "k1", "pid_ns": "pid:[1]", "pid": 1}
    return WorkerRow(**{**defaults, **fields})  # type: ignore[arg-type]


def test_only_the_same_kernel_and_pid_namespace_read_a_pid() -> None:
    here = boot.Machine("box", "k1", "pid:[1]")
    assert here.reads_pids_of(row())
    assert not here.reads_pids_of(row(pid_ns="pid:[2]"))  # a container on this kernel
    assert not here.reads_pids_of(row(boot_id="k2"))  # a clone, or this box rebooted
    assert not here.reads_pids_of(row(host="other"))
    assert not here.reads_pids_of(row(boot_id="", pid_ns=""))  # a worker from before
    assert not boot.Machine("box", "k1", "").reads_pids_of(row(pid_ns=""))  # /proc not its own
    mine = boot.this_machine()
    assert mine.boot_id and mine.pid_ns.startswith("pid:[")


def in_own_pid_namespace(env: dict[str, str], label: str, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            *("unshare", "--pid", "--fork", "--mount-proc", "--kill-child"),
            *(sys.executable, str(ROOT / "manage.py"), "runloop", "--worker-id", label),
        ],
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def test_two_workers_sharing_a_host_name_in_two_pid_namespaces_live_side_by_side(
    tmp_path: Path,
) -> None:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.fail("this test needs root and unshare (util-linux), as here and in CI")
    env = process_env(
        LOOP_HEARTBEAT_SECONDS="1",
        LOOP_WORKER_DEAD_AFTER="3",
        LOOP_REAP_SECONDS="0.1",
        LOOP_IDLE_SLEEP_MS="20",
        LOOP_MIN_FREE_MB="0",
        LOOP_WORKER_HOST="same-name",
    )
    procs = [in_own_pid_namespace(env, f"box-{n}", tmp_path / f"w{n}.log") for n in (1, 2)]
    try:
        rows = wait_for(
            lambda: (
                list(WorkerRow.objects.filter(state="running").order_by("label")) or None
                if WorkerRow.objects.filter(state="running").count() == 2
                else None
            ),
            timeout=60,
        )
        # Each is pid 1 of its namespace: by host name and pid they would be one process.
        assert [(w.host, w.pid) for w in rows] == [("same-name", 1), ("same-name", 1)]
        assert rows[0].pid_ns != rows[1].pid_ns and rows[0].boot_id == rows[1].boot_id
        for n in range(6):
            make_task(*(step(f"s{k}") for k in range(5)), title=f"shared {n}")
        wait_for(lambda: not Task.objects.open().exists(), timeout=60)
        time.sleep(4)  # past the dead-after, looking for dead peers ten times a second
        assert not Event.objects.filter(kind=EventKind.WORKER_DEAD).exists()
        assert not Event.objects.filter(kind=EventKind.LEASE_RELEASED).exists()
        assert WorkerRow.objects.filter(state="running").count() == 2

        # One dies (its whole namespace); its pid means nothing to the other, whose heartbeat
        # reading finds it dead once its heartbeat is older than the dead-after.
        os.killpg(procs[0].pid, signal.SIGKILL)
        procs[0].wait(timeout=30)
        dead = wait_for(
            lambda: Event.objects.filter(kind=EventKind.WORKER_DEAD).first(), timeout=30
        )
        assert dead.data["worker"] == rows[0].pk and dead.actor == f"worker:{rows[1].pk}"
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
