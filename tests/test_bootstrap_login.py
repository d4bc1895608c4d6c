"""`manage.py bootstrap` (bin/up runs it on every start): Dad's first password is shown once,
when the user is made, and is never kept in plaintext."""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth import authenticate
from django.core.management import call_command


@pytest.fixture(autouse=True)
def data_dir(tmp_path: Path, settings: Any) -> Path:
    settings.DATA_DIR = tmp_path
    return tmp_path


def bootstrap() -> str:
    out = io.StringIO()
    call_command("bootstrap", stdout=out)
    return out.getvalue()


def test_the_first_password_is_printed_once_and_works(db: None) -> None:
    first = bootstrap()
    found = re.search(r"Log in as: dad / password: (\S+)", first)
    assert found, first
    assert authenticate(username="dad", password=found.group(1)) is not None

    again = bootstrap()
    assert found.group(1) not in again and "/ password:" not in again
    assert "changepassword dad" in again
    # Nothing on disk holds it.
    data = Path(settings.DATA_DIR)
    assert not any(
        found.group(1) in p.read_text(errors="ignore")
        for p in data.iterdir()
        if p.is_file() and p.stat().st_size < 100_000
    )


def test_a_plaintext_login_file_left_by_an_older_version_is_deleted(db: None) -> None:
    old = Path(settings.DATA_DIR) / "admin-login.txt"
    old.write_text("dad an-old-password\n")
    try:
        out = bootstrap()
        assert not old.exists()
        assert "an-old-password" not in out
        assert f"Deleted {old}" in out
    finally:
        old.unlink(missing_ok=True)
