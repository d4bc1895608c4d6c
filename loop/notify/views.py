"""The browser's side of Web Push (DESIGN.md §17): the application server key, a browser's
subscription kept (or forgotten) for the signed-in person, and the service worker, served from
the site's root so that it may show the site's notifications."""

from __future__ import annotations

import base64
import binascii
import json
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_GET, require_POST

from ..models import PushSubscription
from .channels import vapid_public_key

SERVICE_WORKER = Path(settings.BASE_DIR) / "static" / "loop" / "sw.js"


def _bad(field: str, why: str) -> JsonResponse:
    return JsonResponse({"error": f"{field}: {why}", "field": field}, status=400)


def _key(raw: Any, size: int) -> bytes | None:
    if not isinstance(raw, str) or len(raw) > 200:
        return None
    try:
        value = base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4))
    except (binascii.Error, ValueError):
        return None
    return value if len(value) == size else None


@require_GET
@login_required
def push_key(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"key": vapid_public_key()})


@require_POST
@login_required
def push_subscribe(request: HttpRequest) -> JsonResponse:
    """`{"endpoint", "keys": {"p256dh", "auth"}}` as the browser's PushSubscription gives it;
    `{"endpoint", "remove": true}` forgets it."""
    try:
        body = json.loads(request.body or b"{}")
    except (ValueError, UnicodeDecodeError):
        return _bad("body", "not JSON")
    if not isinstance(body, dict):
        return _bad("body", "not a JSON object")
    endpoint = body.get("endpoint")
    if (
        not isinstance(endpoint, str)
        or len(endpoint) > 2000
        or urlsplit(endpoint).scheme not in ("https", "http")
        or not urlsplit(endpoint).netloc
    ):
        return _bad("endpoint", "an http(s) URL of at most 2000 characters is needed")
    if body.get("remove") is True:
        PushSubscription.objects.filter(endpoint=endpoint, user_id=request.user.pk or 0).delete()
        return JsonResponse({"removed": True})
    keys = body.get("keys")
    if not isinstance(keys, dict):
        return _bad("keys", "an object with p256dh and auth is needed")
    if _key(keys.get("p256dh"), 65) is None:
        return _bad("keys.p256dh", "a base64url P-256 public key (65 bytes) is needed")
    if _key(keys.get("auth"), 16) is None:
        return _bad("keys.auth", "a base64url secret of 16 bytes is needed")
    PushSubscription.objects.update_or_create(
        endpoint=endpoint,
        defaults={"user": request.user, "p256dh": keys["p256dh"], "auth": keys["auth"]},
    )
    return JsonResponse({"subscribed": True})


@require_GET
def service_worker(request: HttpRequest) -> HttpResponse:
    response = HttpResponse(SERVICE_WORKER.read_bytes(), content_type="text/javascript")
    response["Service-Worker-Allowed"] = "/"
    response["Cache-Control"] = "no-cache"
    return response
