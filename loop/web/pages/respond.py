"""How a dashboard POST answers: htmx gets a small flash fragment (the live push updates the
page itself); a plain form post gets a redirect with a message, or an error page."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils.http import url_has_allowed_host_and_scheme

from ... import permissions


def can_act(request: HttpRequest) -> bool:
    """Whether to show the buttons: answering and steering need the same permission."""
    return permissions.may(request.user, "answer questions")


def actor(request: HttpRequest) -> str:
    return request.user.get_username()


def back(request: HttpRequest, fallback: str) -> str:
    target = request.POST.get("next") or ""
    if url_has_allowed_host_and_scheme(target, {request.get_host()}, request.is_secure()):
        return target
    return fallback


def answer(
    request: HttpRequest, message: str, *, status: int = 200, fallback: str = "/"
) -> HttpResponse:
    level = "ok" if status < 400 else "error"
    if getattr(request, "htmx", False):
        return render(
            request, "loop/flash.html", {"message": message, "level": level}, status=status
        )
    if status < 400:
        messages.success(request, message)
        return redirect(back(request, fallback))
    return render(
        request,
        "loop/problem.html",
        {"message": message, "back": back(request, fallback)},
        status=status,
    )
