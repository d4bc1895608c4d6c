"""One clock: each request shows times in its person's own zone (`Clock`), else the site's
TIME_ZONE. `loop/templatetags/clock.py` formats them in the zone this activates."""

from __future__ import annotations

import zoneinfo
from collections.abc import Callable
from functools import cache

from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse
from django.utils import timezone

from ..models import Clock


@cache
def known() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones())


def of(user: object) -> str:
    """The person's zone, or "" for the site's."""
    if not getattr(user, "is_authenticated", False):
        return ""
    me = int(getattr(user, "pk", 0) or 0)
    return Clock.objects.filter(user_id=me).values_list("time_zone", flat=True).first() or ""


class ActiveZone:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        try:
            name = of(getattr(request, "user", None))
        except DatabaseError:
            # The database is down: the site's zone; the view meets the same error and
            # answers 503 with the reason (loop/web/unavailable.py), the one way it is said.
            name = ""
        if name in known():
            timezone.activate(zoneinfo.ZoneInfo(name))
        else:
            timezone.deactivate()
        try:
            return self.get_response(request)
        finally:
            timezone.deactivate()
