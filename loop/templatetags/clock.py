"""One clock for every page: `{{ moment|when }}` is a `<time>` element that reads "3 min ago"
(or "in 5 min"), with the absolute time in the viewer's zone on hover; `{{ moment|at }}` is the
absolute time alone, `{{ seconds|duration }}` a length of time ("1.2 s", "3 min 4 s").

The zone is the one active for the request (`loop.web.zones`: the person's own setting, else
the site's TIME_ZONE), so every page shows the same clock."""

from __future__ import annotations

from datetime import datetime, timedelta

from django import template
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

register = template.Library()


def absolute(moment: datetime) -> str:
    """ "Wed 2 Dec 2026, 18:04:05 CET", in the active zone."""
    local = timezone.localtime(moment)
    return f"{local:%a} {local.day} {local:%b %Y, %H:%M:%S} {local.tzname() or ''}".strip()


def relative(moment: datetime, now: datetime | None = None) -> str:
    seconds = ((now or timezone.now()) - moment).total_seconds()
    ahead = seconds < 0
    seconds = abs(seconds)
    if seconds < 10:
        return "just now"
    if seconds < 60:
        words = f"{int(seconds)} s"
    elif seconds < 3600:
        words = f"{int(seconds // 60)} min"
    elif seconds < 86400:
        words = f"{int(seconds // 3600)} h"
    elif seconds < 7 * 86400:
        days = int(seconds // 86400)
        words = f"{days} day{'s' if days > 1 else ''}"
    else:
        local = timezone.localtime(moment)
        return f"{local.day} {local:%b %Y, %H:%M}"
    return f"in {words}" if ahead else f"{words} ago"


@register.filter
def when(moment: datetime | None) -> SafeString | str:
    if moment is None:
        return ""
    return format_html(
        '<time class="when" datetime="{}" title="{}">{}</time>',
        moment.isoformat(),
        absolute(moment),
        relative(moment),
    )


@register.filter
def at(moment: datetime | None) -> SafeString | str:
    if moment is None:
        return ""
    local = timezone.localtime(moment)
    return format_html(
        '<time datetime="{}" title="{}">{}</time>',
        moment.isoformat(),
        absolute(moment),
        f"{local.day} {local:%b, %H:%M}",
    )


def length(seconds: float) -> str:
    """ "0.4 s", "1.2 s", "48 s", "3 min 4 s", "2 h 5 min"."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 60:
        return f"{round(seconds)} s"
    if seconds < 3600:
        minutes, rest = divmod(round(seconds), 60)
        return f"{minutes} min" + (f" {rest} s" if rest else "")
    hours, rest = divmod(round(seconds) // 60, 60)
    return f"{hours} h" + (f" {rest} min" if rest else "")


@register.filter
def duration(value: float | timedelta | None) -> str:
    if value is None:
        return ""
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    return length(max(0.0, seconds))
