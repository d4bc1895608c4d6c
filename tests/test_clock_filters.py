"""One clock (issue 28, item 4): every time in the viewer's zone (his own setting, else
TIME_ZONE), relative with the absolute time on hover, by one template filter."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from loop.templatetags import clock

from .conftest import make_task, step


@pytest.mark.sqlite_only
def test_relative_absolute_and_durations() -> None:
    now = datetime(2026, 12, 2, 17, 0, tzinfo=UTC)
    assert clock.relative(now - timedelta(seconds=3), now) == "just now"
    assert clock.relative(now - timedelta(minutes=3, seconds=5), now) == "3 min ago"
    assert clock.relative(now + timedelta(hours=2, minutes=1), now) == "in 2 h"
    assert clock.relative(now - timedelta(days=2), now) == "2 days ago"
    with timezone.override(ZoneInfo("Europe/Berlin")):
        assert clock.absolute(now) == "Wed 2 Dec 2026, 18:00:00 CET"
        assert clock.relative(now - timedelta(days=30), now) == "2 Nov 2026, 18:00"
    assert [clock.length(s) for s in (0.04, 1.23, 48.4, 184, 7500)] == [
        "0.0 s", "1.2 s", "48 s", "3 min 4 s", "2 h 5 min",
    ]  # fmt: skip


def test_every_page_shows_the_persons_own_zone(dad: User, settings: object) -> None:
    task = make_task(step("a"), title="clocked")
    page = Client()
    page.force_login(dad)
    shown = page.get(f"/tasks/{task.pk}").content.decode()
    assert "UTC" in shown.split('class="when"')[1].split(">")[0]  # the site's zone
    assert page.post("/clock", {"time_zone": "Mars/Olympus"}).status_code == 400
    assert page.post("/clock", {"time_zone": "Asia/Tokyo"}).status_code == 302
    for url in (f"/tasks/{task.pk}", "/tasks/"):
        shown = page.get(url).content.decode()
        hover = shown.split('class="when"')[1].split(">")[0]
        assert "JST" in hover, (url, hover)
    page.post("/clock", {"time_zone": ""})
    assert "JST" not in page.get("/tasks/").content.decode()
