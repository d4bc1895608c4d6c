"""`{% asked q %}`: when a question was asked and why, on its card (DESIGN.md §17)."""

from __future__ import annotations

from typing import Any

from django import template

from ..notify import news
from ..questions import Question

register = template.Library()


@register.inclusion_tag("loop/asked.html")
def asked(q: Question) -> dict[str, Any]:
    event = news.asked_event(q.step)
    return {
        "at": event.created_at if event else None,
        "ago": news.ago(event.created_at) if event else "",
        "why": news.why(q.step, q),
    }
