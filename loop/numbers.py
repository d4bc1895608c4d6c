"""Numbers people and machines type: from a query string, a form, a WebSocket's parameters, a
command's option or a setting. One reader for all of them, so each door accepts the same
spelling and refuses the rest by name.

A number here is written in ASCII digits, nothing else: `str.isdigit()` takes '²' (and `int()`
then refuses it, a 500), and `int()` takes '١٢', '１２', ' 12', '+12' and '1_000', none of which
a person means as a page or an id. A whole number is `-?[0-9]+`; a number may add a fraction
(`1.5`, `.5`), never an exponent, `nan` or `inf`. Pure Python: the settings read it too.
"""

from __future__ import annotations

import re

_WHOLE = re.compile(r"-?[0-9]+")
_NUMBER = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)")
LONGEST = 30  # characters: far past any id, count or setting, short of a slow int()


class NotANumber(ValueError):
    """The text, named, is not a number of the kind asked for; the message says what it must
    be (`page: must be a whole number from 0 to 1000, not '²'`)."""


def _bounds(low: float | None, high: float | None) -> str:
    if low is not None and high is not None:
        return f" from {_shown_bound(low)} to {_shown_bound(high)}"
    if low is not None:
        return f" of {_shown_bound(low)} or more"
    if high is not None:
        return f" of {_shown_bound(high)} or less"
    return ""


def _shown_bound(bound: float) -> str:
    return str(bound) if isinstance(bound, int) else f"{bound:g}"


def whole(
    text: str | bytes | None, what: str, *, low: int | None = None, high: int | None = None
) -> int:
    """`text` as a whole number within [low, high], or NotANumber naming `what`."""
    kind = f"a whole number{_bounds(low, high)}"
    if isinstance(text, bytes):
        text = text.decode("ascii", errors="replace")
    if text is None or len(text) > LONGEST or not _WHOLE.fullmatch(text):
        raise NotANumber(f"{what}: must be {kind}, not {_shown(text)}")
    value = int(text)
    if (low is not None and value < low) or (high is not None and value > high):
        raise NotANumber(f"{what}: must be {kind}, not {_shown(text)}")
    return value


def number(
    text: str | None, what: str, *, low: float | None = None, high: float | None = None
) -> float:
    """`text` as a number (a fraction allowed) within [low, high], or NotANumber naming `what`."""
    kind = f"a number{_bounds(low, high)}"
    if text is None or len(text) > LONGEST or not _NUMBER.fullmatch(text):
        raise NotANumber(f"{what}: must be {kind}, not {_shown(text)}")
    value = float(text)
    if (low is not None and value < low) or (high is not None and value > high):
        raise NotANumber(f"{what}: must be {kind}, not {_shown(text)}")
    return value


def _shown(text: str | None) -> str:
    if text is None:
        return "nothing"
    return repr(text if len(text) <= 40 else text[:40] + "…")
