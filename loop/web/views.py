from __future__ import annotations

import logging

from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET

from .. import health

log = logging.getLogger("loop.health")


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """For probes: JSON in every state (loop/health.py). 503 while anything in `problems`
    holds; 200 otherwise, `status` "degraded" while something in `degraded` does."""
    try:
        found = health.report()
    except Exception as exc:  # the report catches its checks' failures; this is a last guard
        log.exception("health report failed")
        found = health.Report(problems=[f"health check failed: {type(exc).__name__}: {exc}"])
    return JsonResponse(found.as_json(), status=503 if found.problems else 200)
