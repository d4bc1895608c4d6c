"""Where news goes (DESIGN.md §17): email to each person who may answer questions, Web Push
to their browsers, and a webhook. Each `send` delivers one batch or raises `NotSent`; the
notifier then keeps its cursor and tries the same batch again later (at least once)."""

from __future__ import annotations

import base64
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.mail import EmailMessage, get_connection
from django.db.models import Q, QuerySet

from ..models import PushSubscription
from ..permissions import ANSWER
from .news import MAX_ITEMS, News

log = logging.getLogger("loop.notify")
TIMEOUT = 10  # seconds for one webhook or push request


class NotSent(Exception):
    """A channel could not deliver the batch now."""


def answerers() -> QuerySet[Any]:
    """Active people with the permission to answer questions (directly, by a group, or as
    superusers)."""
    app, codename = ANSWER.split(".")
    User = get_user_model()
    perm = Q(user_permissions__codename=codename, user_permissions__content_type__app_label=app)
    group = Q(
        groups__permissions__codename=codename, groups__permissions__content_type__app_label=app
    )
    return User.objects.filter(Q(is_active=True) & (Q(is_superuser=True) | perm | group)).distinct()


def subject(news: Sequence[News]) -> str:
    questions = sum(1 for n in news if n.kind in ("question", "reminder"))
    if len(news) == 1:
        return f"Pippa Loop: {news[0].title}"
    if questions == len(news):
        return f"Pippa Loop: {questions} questions wait for you"
    return f"Pippa Loop: {len(news)} things need you"


def body(news: Sequence[News]) -> str:
    parts = []
    for n in news[:MAX_ITEMS]:
        parts.append(
            "\n".join(
                [
                    n.title,
                    "",
                    *n.lines,
                    "",
                    f"Answer it here: {n.url}"
                    if n.kind in ("question", "reminder", "plan")
                    else f"See: {n.url}",
                ]
            )
        )
    if len(news) > MAX_ITEMS:
        parts.append(f"… and {len(news) - MAX_ITEMS} more: {settings.SITE_URL}/")
    parts.append(
        "You get this because you may answer Pippa's questions. Nothing is done until you "
        "answer on the dashboard; this mail asks nothing of its own."
    )
    return "\n\n———\n\n".join(parts) + "\n"


class Email:
    name = "email"

    def enabled(self) -> bool:
        return settings.LOOP_NOTIFY_EMAIL

    def send(self, news: Sequence[News]) -> None:
        to = sorted({u.email for u in answerers() if u.email})
        if not to:
            return
        mail = EmailMessage(subject(news), body(news), settings.DEFAULT_FROM_EMAIL, to=to)
        try:
            get_connection(fail_silently=False).send_messages([mail])
        except Exception as exc:
            raise NotSent(f"email: {type(exc).__name__}: {exc}") from exc


def payload(news: Sequence[News]) -> dict[str, Any]:
    return {
        "title": subject(news).removeprefix("Pippa Loop: "),
        "text": "\n".join(n.title for n in news[:MAX_ITEMS]),
        "url": news[0].url if len(news) == 1 else settings.SITE_URL + "/",
        "items": [n.as_dict() for n in news[:MAX_ITEMS]],
        "more": max(0, len(news) - MAX_ITEMS),
    }


class Webhook:
    name = "webhook"

    def enabled(self) -> bool:
        return bool(settings.LOOP_NOTIFY_WEBHOOK_URL)

    def send(self, news: Sequence[News]) -> None:
        import requests

        try:
            answer = requests.post(
                settings.LOOP_NOTIFY_WEBHOOK_URL, json=payload(news), timeout=TIMEOUT
            )
        except requests.RequestException as exc:
            raise NotSent(f"webhook: {exc}") from exc
        if answer.status_code >= 300:
            raise NotSent(f"webhook: HTTP {answer.status_code}")


# ---- Web Push --------------------------------------------------------------------------------


def vapid_file() -> Path:
    return Path(settings.DATA_DIR) / "vapid_private.pem"


def vapid_public_key() -> str:
    """The application server key (base64url, an uncompressed P-256 point) browsers subscribe
    with. The key pair is made at the first call and kept in the data folder, owner-only."""
    from cryptography.hazmat.primitives import serialization
    from py_vapid import Vapid01

    path = vapid_file()
    if not path.exists():
        vapid = Vapid01()
        vapid.generate_keys()
        pem = vapid.private_pem()
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(pem)
            out.flush()
            os.fsync(out.fileno())
        try:
            os.link(tmp, path)  # never over another's: two processes at once, the first wins
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    vapid = Vapid01.from_file(str(path))
    raw = vapid.public_key.public_bytes(
        serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
    )
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


class Push:
    name = "push"

    def enabled(self) -> bool:
        return PushSubscription.objects.exists()

    def send(self, news: Sequence[News]) -> None:
        from pywebpush import WebPushException, webpush

        vapid_public_key()  # made if missing
        data = json.dumps(payload(news))
        failed = []
        for sub in PushSubscription.objects.filter(user__in=answerers()):
            try:
                webpush(
                    {"endpoint": sub.endpoint, "keys": {"p256dh": sub.p256dh, "auth": sub.auth}},
                    data,
                    vapid_private_key=str(vapid_file()),
                    vapid_claims={"sub": settings.LOOP_PUSH_CONTACT},
                    timeout=TIMEOUT,
                    ttl=24 * 3600,
                )
            except WebPushException as exc:
                status = exc.response.status_code if exc.response is not None else None
                if status in (404, 410):  # the browser unsubscribed: forget it
                    log.info("push subscription %s is gone (%s): removed", sub.pk, status)
                    sub.delete()
                else:
                    failed.append(f"{sub.pk}: {exc}")
            except Exception as exc:
                failed.append(f"{sub.pk}: {type(exc).__name__}: {exc}")
        if failed:
            raise NotSent("push: " + "; ".join(failed))


CHANNELS: list[Any] = [Email(), Webhook(), Push()]
