"""Your clock: the time zone every page shows times in (`loop.web.zones`)."""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from ...models import Clock
from .. import zones
from . import context


@login_required
@require_http_methods(["GET", "HEAD", "POST"])
def clock_page(request: HttpRequest) -> HttpResponse:
    """POST `time_zone`: one of the IANA zones, or "" for the site's."""
    error = ""
    if request.method == "POST":
        name = str(request.POST.get("time_zone", "")).strip()
        me = int(request.user.pk or 0)
        if name and name not in zones.known():
            error = f"time_zone: no time zone '{name[:64]}'"
        else:
            if name:
                Clock.objects.update_or_create(user_id=me, defaults={"time_zone": name})
            else:
                Clock.objects.filter(user_id=me).delete()
            messages.success(request, f"Times are shown in {name or settings.TIME_ZONE} now.")
            return redirect("loop:clock")
    return render(
        request,
        "loop/clock.html",
        {
            "mine": zones.of(request.user),
            "site": settings.TIME_ZONE,
            "zones": sorted(zones.known()),
            "error": error,
            "waiting": context.waiting_count(),
        },
        status=400 if error else 200,
    )
