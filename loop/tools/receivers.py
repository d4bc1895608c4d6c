"""What an http(s) URL names (`target`), and the receivers that deduplicate on
`Idempotency-Key` (the setting LOOP_IDEMPOTENT_RECEIVERS).

A listed URL prefix says: the receiver there keeps what it did under each key and answers a
request that repeats a key with the stored answer, acting once (as payment APIs do). A POST or
PUT to it is then safe to repeat: a cut sends it again with the same key instead of asking.

A URL matches a prefix by its parts, as the http tools connect and send it (`target`): the same scheme, host
and port, and a path that starts with the prefix's path at a segment boundary (`/pay` matches
`/pay` and `/pay/x`, not `/payments`). So `https://pay.example.com.evil.net/` or
`https://pay.example.com@evil.net/` never matches `https://pay.example.com/`. A path with a
`.` or `..` segment (plain or percent-encoded) or an encoded slash matches nothing: the
receiver might resolve it to somewhere the prefix does not cover. Pure: no Django.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

_NOT_IN_PATH = re.compile(r"[\x00-\x20\x7f]")  # a space or a control character
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_NOT_ASCII = re.compile(r"[^\x00-\x7f]+")


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str
    port: int
    path: str  # with the query, as the request line carries it

    @property
    def authority(self) -> str:
        default = 443 if self.scheme == "https" else 80
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == default else f"{host}:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.authority}{self.path}"


@lru_cache(maxsize=1024)
def target(url: str) -> Target:
    """ValueError, naming the url, unless it is an http(s) URL with a host. A character
    beyond ASCII in the path or query goes out percent-encoded (UTF-8), as a browser sends it.
    Remembered: a side-effect step asks it of its URL several times (is it safe to repeat,
    its intent's target, the send, its judging)."""
    if _CONTROL.search(url):  # urlsplit would drop a tab or line break without a word
        raise ValueError(f"'url' has a control character: {url!r}")
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"'url' is not a valid URL: {url!r} ({exc})") from None
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise ValueError(f"'url' must be an http(s) URL, not {url!r}")
    if parts.username is not None or parts.password is not None:
        # Not sent (a request line has no place for it), yet it would be shown as the
        # request and kept in the journal: refused, without repeating it.
        raise ValueError(
            "'url' carries a user name or password (user:pass@host), which is never sent; "
            "give credentials in an Authorization header"
        )
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    if _NOT_IN_PATH.search(path):
        raise ValueError(f"'url' has a space or control character in its path: {url!r}")
    path = _NOT_ASCII.sub(lambda found: urllib.parse.quote(found[0]), path)
    if port is None:
        port = 443 if parts.scheme == "https" else 80
    return Target(parts.scheme, parts.hostname, port, path)


@dataclass(frozen=True)
class Prefix:
    scheme: str
    host: str
    port: int
    segments: tuple[str, ...]  # the path's segments; a trailing "/" adds none

    def covers(self, where: Target) -> bool:
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
        where = target(entry)
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
        where = target(url)
    except ValueError:
        return False
    return any(prefix.covers(where) for prefix in _prefixes(tuple(entries)))
