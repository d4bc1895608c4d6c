"""Judges execute a step and say what should become of it (a Verdict)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Verdict:
    kind: str  # "done" | "failed" | "retry" | "blocked"
    output: Any = None
    error: str = ""
    delay: float | None = None  # retry: seconds to wait (None: the backoff decides)

    @classmethod
    def done(cls, output: Any) -> Verdict:
        return cls("done", output=output)

    @classmethod
    def failed(cls, error: str) -> Verdict:
        return cls("failed", error=error)

    @classmethod
    def retry(cls, error: str, delay: float | None = None) -> Verdict:
        return cls("retry", error=error, delay=delay)

    @classmethod
    def blocked(cls, error: str) -> Verdict:
        return cls("blocked", error=error)
