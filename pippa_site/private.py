"""The data folder and the SQLite files are private to the user who runs Pippa Loop: they hold
sessions, password hashes, the journal and every receipt.

Called from settings.py, so it runs first in every process (daphne, runloop, each command):
the umask makes whatever the process creates from then on owner-only (the SQLite file, its
-wal and -shm, mail files, the secret key), and files made by an older version are narrowed."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

UMASK = 0o077


def make_private(data_dir: Path, sqlite_files: list[Path]) -> None:
    os.umask(UMASK)
    data_dir.mkdir(parents=True, exist_ok=True)
    _narrow(data_dir, 0o700)
    for database in sqlite_files:
        for suffix in ("", "-wal", "-shm", "-journal"):
            path = database.with_name(database.name + suffix)
            if path.exists():
                _narrow(path, 0o600)


def _narrow(path: Path, mode: int) -> None:
    try:
        if path.stat().st_mode & 0o777 & ~mode:
            path.chmod(mode)
    except OSError as exc:  # not ours to change: say so, and go on
        warnings.warn(f"{path}: could not make it private ({exc})", stacklevel=3)
