"""`{% load answers %}`: the fields of a question's "Edit, then allow" (`loop.web.answers`)."""

from __future__ import annotations

from django import template

from ..models import Step
from ..web.answers import EditField, editable

register = template.Library()


@register.filter
def edit_fields(step: Step) -> list[EditField]:
    return editable(step)
