"""A dashboard or admin form over Django's limits answers with a page that says so.

Django reads a form's fields the first time something asks (here: the CSRF check), and a body
over DATA_UPLOAD_MAX_MEMORY_SIZE (or with more than DATA_UPLOAD_MAX_NUMBER_FIELDS fields) then
raises: the answer was a bare "Bad Request (400)" and a traceback in the server's log. This
middleware reads the fields first, before CsrfViewMiddleware, and answers 413 (or 400) with the
reason. The API (CSRF-exempt) reads its own body and answers JSON (loop/api/core.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils.deprecation import MiddlewareMixin


class FormLimits(MiddlewareMixin):
    def process_view(
        self, request: HttpRequest, view: Callable[..., Any], args: Any, kwargs: Any
    ) -> HttpResponse | None:
        if request.method != "POST" or getattr(view, "csrf_exempt", False):
            return None
        try:
            request.POST  # noqa: B018 (reading it is the point)
        except RequestDataTooBig:
            limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
            return refused(
                request,
                f"The form is larger than {limit:,} bytes, more than this site reads. "
                f"A plan may be at most {settings.LOOP_PLAN_MAX_BYTES:,} bytes.",
                status=413,
            )
        except (TooManyFieldsSent, TooManyFilesSent) as exc:
            return refused(request, f"The form has too many fields: {exc}", status=400)
        return None


def refused(request: HttpRequest, message: str, *, status: int) -> HttpResponse:
    return render(
        request, "loop/problem.html", {"message": message, "back": request.path}, status=status
    )
