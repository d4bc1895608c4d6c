from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET

from .. import health


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    found = health.problems()
    return JsonResponse({"ok": not found, "problems": found}, status=503 if found else 200)
