"""Throttles for guessed credentials: wrong passwords (the login pages, the admin's too) and
wrong agent tokens (the HTTP API).

Each limit is a fixed window per key: the first failure opens it for `PIPPA_THROTTLE_SECONDS`;
once a key has counted its limit of failures, every attempt under it is refused until the window
ends — the right password or token too, or a guesser would learn when it guessed right.

    login    from a browser that logged in to the account before (its device cookie, signed,
             naming the account): PIPPA_LOGIN_LIMIT failures per (account, that browser), and
             nothing else counts against it
    login    from anywhere else: PIPPA_LOGIN_LIMIT failures per (account, client address), and
             PIPPA_LOGIN_IP_LIMIT per client address, whatever the account
    token    PIPPA_TOKEN_IP_LIMIT wrong bearer tokens per client address

So guesses at Dad's password — from a task's `http.post` on this very host, or anyone — lock out
the guessers, never the browser Dad logged in with (the device cookie; OWASP's "device
cookies" against lockout).

Counts live in the `throttle` cache (settings.py): Redis when REDIS_URL is set, shared by every
server process; otherwise the server process's memory, which is exact for the embedded default's
one daphne (with N server processes and no Redis, a limit is N times as loose). While Redis
does not answer, the counts go to this process's memory (`throttle-local`) for
FALLBACK_SECONDS at a time, said once in the log: a limit is then at most N times as loose,
never gone. The client address is REMOTE_ADDR: behind a proxy, run daphne with
`--proxy-headers` so it is the client's.
"""

from __future__ import annotations

import hashlib
import logging
import math
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from django.conf import settings
from django.core import signing
from django.core.cache import caches
from django.http import HttpRequest, HttpResponse

log = logging.getLogger("loop.throttle")

DEVICE_COOKIE = "pippa_device"
DEVICE_SALT = "loop.throttle.device"
DEVICE_DAYS = 365
FALLBACK_SECONDS = 10.0  # how long the counts stay in this process before Redis is tried again

T = TypeVar("T")


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


def device_of(request: HttpRequest | None, username: str) -> str:
    """The browser's own id if it carries a valid device cookie for this account, else ''."""
    raw = request.COOKIES.get(DEVICE_COOKIE, "") if request is not None else ""
    if not raw:
        return ""
    try:
        value = signing.loads(raw, salt=DEVICE_SALT, max_age=DEVICE_DAYS * 86400)
    except signing.BadSignature:
        return ""
    if not isinstance(value, dict) or value.get("u") != _hashed(username):
        return ""
    return str(value.get("d", ""))


def remember_device(request: HttpRequest, response: HttpResponse, username: str) -> None:
    """After a successful login: this browser is the account's own from now on."""
    device = device_of(request, username) or secrets.token_urlsafe(16)
    response.set_cookie(
        DEVICE_COOKIE,
        signing.dumps({"u": _hashed(username), "d": device}, salt=DEVICE_SALT),
        max_age=DEVICE_DAYS * 86400,
        httponly=True,
        samesite="Lax",
        secure=settings.SESSION_COOKIE_SECURE,
    )


def login_limits(request: HttpRequest | None, username: str) -> list[Limit]:
    device = device_of(request, username)
    if device:
        return [
            Limit(f"login-device:{_hashed(username)}:{_hashed(device)}", settings.PIPPA_LOGIN_LIMIT)
        ]
    address = client_address(request)
    return [
        Limit(f"login:{_hashed(username)}:{_hashed(address)}", settings.PIPPA_LOGIN_LIMIT),
        Limit(f"login-ip:{_hashed(address)}", settings.PIPPA_LOGIN_IP_LIMIT),
    ]


def token_limits(request: HttpRequest) -> list[Limit]:
    return [Limit(f"token-ip:{_hashed(client_address(request))}", settings.PIPPA_TOKEN_IP_LIMIT)]


_local_until = 0.0  # time.monotonic() until which the counts stay in this process


def _counting(work: Callable[[Any], T]) -> T:
    """`work` on the throttle's cache; if that is Redis and it fails (down, cut off, timing
    out), on this process's memory instead, for FALLBACK_SECONDS before Redis is tried again."""
    global _local_until
    local = caches["throttle-local"]
    if not settings.REDIS_URL:
        return work(caches["throttle"])
    if time.monotonic() < _local_until:
        return work(local)
    try:
        result = work(caches["throttle"])
    except Exception as exc:  # redis.RedisError, OSError, a timeout: any failure to count
        if not _local_until:
            log.warning(
                "throttle: Redis does not answer (%s); counting failed logins and tokens in "
                "this process until it does",
                exc,
            )
        _local_until = time.monotonic() + FALLBACK_SECONDS
        return work(local)
    if _local_until:
        log.info("throttle: Redis answers again; counting there")
        _local_until = 0.0
    return result


def wait(limits: list[Limit]) -> int:
    """Seconds until an attempt under `limits` is allowed again; 0: allowed now."""
    return _counting(lambda cache: _wait(cache, limits))


def _wait(cache: Any, limits: list[Limit]) -> int:
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
    _counting(lambda cache: _failed(cache, limits))


def _failed(cache: Any, limits: list[Limit]) -> None:
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
    keys = [f"{limit.key}:{part}" for limit in limits for part in ("n", "until")]
    _counting(lambda cache: cache.delete_many(keys))


def in_words(seconds: int) -> str:
    minutes = math.ceil(seconds / 60)
    return f"{seconds} seconds" if seconds < 60 else f"{minutes} minute{'s' * (minutes != 1)}"
