"""Throttles for guessed credentials: wrong passwords (the login pages, the admin's too) and
wrong agent tokens (the HTTP API).

Each limit is a fixed window per key: the first failure opens it for `PIPPA_THROTTLE_SECONDS`;
once a key has counted its limit of failures, every attempt under it is refused until the window
ends — the right password or token too, or a guesser would learn when it guessed right.

    login    PIPPA_LOGIN_LIMIT failures per (username, client address)
    login    PIPPA_LOGIN_IP_LIMIT failures per client address, whatever the username
    token    PIPPA_TOKEN_IP_LIMIT wrong bearer tokens per client address

Counts live in the `throttle` cache (settings.py): Redis when REDIS_URL is set, shared by every
server process; otherwise the server process's memory, which is exact for the embedded default's
one daphne (with N server processes and no Redis, a limit is N times as loose). The client
address is REMOTE_ADDR: behind a proxy, run daphne with `--proxy-headers` so it is the client's.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.cache import caches
from django.http import HttpRequest


@dataclass(frozen=True)
class Limit:
    key: str
    limit: int


def client_address(request: HttpRequest | None) -> str:
    if request is None:
        return "unknown"
    return str(request.META.get("REMOTE_ADDR") or "unknown")


def _hashed(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def login_limits(request: HttpRequest | None, username: str) -> list[Limit]:
    address = client_address(request)
    return [
        Limit(f"login:{_hashed(username)}:{_hashed(address)}", settings.PIPPA_LOGIN_LIMIT),
        Limit(f"login-ip:{_hashed(address)}", settings.PIPPA_LOGIN_IP_LIMIT),
    ]


def token_limits(request: HttpRequest) -> list[Limit]:
    return [Limit(f"token-ip:{_hashed(client_address(request))}", settings.PIPPA_TOKEN_IP_LIMIT)]


def _cache() -> Any:
    return caches["throttle"]


def wait(limits: list[Limit]) -> int:
    """Seconds until an attempt under `limits` is allowed again; 0: allowed now."""
    cache = _cache()
    now = time.time()
    longest = 0
    for limit in limits:
        if (cache.get(f"{limit.key}:n") or 0) < limit.limit:
            continue
        until = cache.get(f"{limit.key}:until")
        if until is not None and until > now:
            longest = max(longest, math.ceil(until - now))
    return longest


def failed(limits: list[Limit]) -> None:
    """Count one failure under each of `limits`. The count is an INCR (atomic on Redis); the
    window's end is kept as a time beside it, so a window ends when that time passes even if
    the cache keeps its keys a little longer."""
    cache = _cache()
    window = settings.PIPPA_THROTTLE_SECONDS
    now = time.time()
    for limit in limits:
        count, until = f"{limit.key}:n", f"{limit.key}:until"
        if cache.add(until, now + window, window):
            cache.set(count, 0, window)  # a new window
        else:
            ends = cache.get(until)
            if ends is None or ends <= now:
                cache.set_many({until: now + window, count: 0}, window)
        try:
            cache.incr(count)
        except ValueError:  # the key expired between the set and the incr
            cache.set(count, 1, window)


def forget(limits: list[Limit]) -> None:
    cache = _cache()
    cache.delete_many([f"{limit.key}:{part}" for limit in limits for part in ("n", "until")])


def in_words(seconds: int) -> str:
    minutes = math.ceil(seconds / 60)
    return f"{seconds} seconds" if seconds < 60 else f"{minutes} minute{'s' * (minutes != 1)}"
