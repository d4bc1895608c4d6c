"""Receivers that deduplicate on `Idempotency-Key` (the setting LOOP_IDEMPOTENT_RECEIVERS).

A listed URL prefix says: the receiver there keeps what it did under each key and answers a
request that repeats a key with the stored answer, acting once (as payment APIs do). A POST or
PUT to it is then safe to repeat: a cut sends it again with the same key instead of asking.

A URL matches a prefix by its parts, as `wire` will connect and send it: the same scheme, host
and port, and a path that starts with the prefix's path at a segment boundary (`/pay` matches
`/pay` and `/pay/x`, not `/payments`). So `https://pay.example.com.evil.net/` or
`https://pay.example.com@evil.net/` never matches `https://pay.example.com/`. A path with a
`.` or `..` segment (plain or percent-encoded) or an encoded slash matches nothing: the
receiver might resolve it to somewhere the prefix does not cover. Pure: no Django.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

from . import wire


@dataclass(frozen=True)
class Prefix:
    scheme: str
    host: str
    port: int
    segments: tuple[str, ...]  # the path's segments; a trailing "/" adds none

    def covers(self, where: wire.Target) -> bool:
        if (where.scheme, where.host, where.port) != (self.scheme, self.host, self.port):
            return False
        segments = _segments(where.path.split("?", 1)[0])
        return segments is not None and segments[: len(self.segments)] == self.segments


def _segments(path: str) -> tuple[str, ...] | None:
    """The path's non-empty segments, or None if one could be read as another path."""
    parts = []
    for raw in path.split("/"):
        if "\\" in raw or "%2f" in raw.lower() or "%5c" in raw.lower():
            return None
        if urllib.parse.unquote(raw) in {".", ".."}:
            return None
        if raw:
            parts.append(raw)
    return tuple(parts)


def parse(entry: str) -> Prefix:
    """One entry of the setting; ValueError naming it unless it is a plain http(s) URL prefix."""
    split = urllib.parse.urlsplit(entry)
    if split.username is not None or split.password is not None:
        raise ValueError(f"{entry!r}: a receiver prefix can't carry a user name or password")
    if split.query or split.fragment or entry.rstrip().endswith(("?", "#")):
        raise ValueError(f"{entry!r}: a receiver prefix is scheme, host, port and path only")
    try:
        where = wire.target(entry)
    except ValueError:
        raise ValueError(
            f"{entry!r}: a receiver prefix must be an http(s) URL with a host"
        ) from None
    segments = _segments(where.path)
    if segments is None:
        raise ValueError(f"{entry!r}: the path has a '.' or '..' segment or an encoded slash")
    return Prefix(where.scheme, where.host, where.port, segments)


def parse_all(entries: Iterable[str]) -> tuple[Prefix, ...]:
    return tuple(parse(entry) for entry in entries)


@lru_cache(maxsize=16)
def _prefixes(entries: tuple[str, ...]) -> tuple[Prefix, ...]:
    return parse_all(entries)


def honours_key(url: str, entries: Iterable[str]) -> bool:
    """Whether `url` is covered by one of these prefixes (the setting's entries)."""
    try:
        where = wire.target(url)
    except ValueError:
        return False
    return any(prefix.covers(where) for prefix in _prefixes(tuple(entries)))
