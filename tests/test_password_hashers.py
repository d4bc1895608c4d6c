"""Tests hash passwords fast; production keeps Django's strong default. The fast hasher is
chosen only by the test switch (`settings.TESTING`: pytest's PYTEST_VERSION)."""

from __future__ import annotations

import os
import subprocess
import sys

from django.conf import settings
from django.contrib.auth.hashers import get_hasher, make_password

from .conftest import ROOT

PRINT_HASHERS = (
    "import django; django.setup(); from django.conf import settings; "
    "print(settings.TESTING, settings.PASSWORD_HASHERS[0])"
)


def hashers_of_a_process(env: dict[str, str]) -> str:
    result = subprocess.run(
        [sys.executable, "-c", PRINT_HASHERS],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**env, "DJANGO_SETTINGS_MODULE": "pippa_site.settings"},
        timeout=60,
        check=True,
    )
    return result.stdout.strip()


def test_the_tests_use_the_fast_hasher() -> None:
    assert settings.TESTING
    assert settings.PASSWORD_HASHERS == ["django.contrib.auth.hashers.MD5PasswordHasher"]
    assert make_password("dad-password-1").startswith("md5$")


def test_production_keeps_the_strong_default() -> None:
    production = {k: v for k, v in os.environ.items() if k != "PYTEST_VERSION"}
    assert hashers_of_a_process(production) == (
        "False django.contrib.auth.hashers.PBKDF2PasswordHasher"
    )
    # The same process under the switch: the switch alone chooses the fast hasher.
    assert hashers_of_a_process({**production, "PYTEST_VERSION": "9"}) == (
        "True django.contrib.auth.hashers.MD5PasswordHasher"
    )
    assert get_hasher().algorithm == "md5"
