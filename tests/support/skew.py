"""A process whose wall clock is off, as a host's with a wrong clock: libfaketime (Debian's
`faketime`, installed by `bin/install --test`) preloaded into it, the process itself (not a
`faketime` parent that forks it, whose pid a test would signal instead)."""

from __future__ import annotations

import glob


def libfaketime() -> str:
    """The library's path, or '' when faketime is not installed."""
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    return found[0] if found else ""


def skewed(env: dict[str, str], seconds: float) -> dict[str, str]:
    """`env` for a process whose wall clock runs `seconds` ahead (behind, if negative). Its
    monotonic clock is left alone, as a wrong host clock leaves it (and libfaketime's faked
    monotonic clock hangs Python's timed waits)."""
    lib = libfaketime()
    if not lib:
        raise RuntimeError("faketime is missing: bin/install --test installs it")
    return {
        **env,
        "LD_PRELOAD": lib,
        "FAKETIME": f"{seconds:+g}s",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_NO_CACHE": "1",
    }
