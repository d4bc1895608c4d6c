"""The data folder and the SQLite files (sessions, password hashes, the journal) are private:
a server or worker process makes them owner-only, and narrows ones an older version left open."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from .conftest import ROOT, kill, wait_for


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def env_for(data: Path) -> dict[str, str]:
    """The embedded default (SQLite under the data folder), whatever this test runs on."""
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL"}}
    env.update(PIPPA_DATA_DIR=str(data), PYTHONUNBUFFERED="1")
    return env


def manage(data: Path, *args: str) -> None:
    subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        env=env_for(data),
        check=True,
        capture_output=True,
        timeout=120,
    )


def test_a_fresh_data_folder_and_database_are_owner_only(tmp_path: Path) -> None:
    os.umask(0o022)  # as a login shell would leave it; the process must not depend on it
    data = tmp_path / "var"
    manage(data, "migrate", "--noinput")
    worker = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "runloop", "--worker-id", "private"],
        env=env_for(data),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        db = data / "pippa.sqlite3"
        wal, shm = Path(f"{db}-wal"), Path(f"{db}-shm")
        wait_for(lambda: wal.exists() and shm.exists(), timeout=60)
        assert mode(data) == 0o700
        assert {p.name: mode(p) for p in (db, wal, shm, data / "secret_key")} == {
            "pippa.sqlite3": 0o600,
            "pippa.sqlite3-wal": 0o600,
            "pippa.sqlite3-shm": 0o600,
            "secret_key": 0o600,
        }
    finally:
        kill(worker)
        os.umask(0o077)


def test_files_an_older_version_left_readable_are_narrowed_at_start(tmp_path: Path) -> None:
    data = tmp_path / "var"
    data.mkdir()
    data.chmod(0o755)
    made = [data / "pippa.sqlite3", data / "pippa.sqlite3-wal", data / "pippa.sqlite3-shm"]
    for path in made:
        path.touch()
        path.chmod(0o644)
    manage(data, "check")
    assert mode(data) == 0o700
    assert [mode(p) for p in made] == [0o600] * 3
