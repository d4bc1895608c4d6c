"""email.send through Django's email framework: SMTP when EMAIL_HOST is set, files otherwise.

The Message-ID is derived from the effect id, so a receiver (or a probe of the file backend)
can tell a repeat from a new message.
"""

from __future__ import annotations

import email.utils
import hashlib
import re
import smtplib
import socket
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.mail import EmailMessage, get_connection
from django.core.validators import validate_email

from ..outcomes import EffectNotSent, EffectRejected
from .base import Arg, ProbeResult, fixed, tool
from .shown import Field


def message_id(effect_id: str) -> str:
    """A Message-ID unique to the effect. A caller's own idempotency key is hashed, so two keys
    sharing a prefix (or holding characters a header can't carry) never look alike."""
    token = effect_id
    if not re.fullmatch(r"[0-9a-f]{64}", effect_id):
        token = hashlib.sha256(effect_id.encode()).hexdigest()
    return f"<{token[:40]}@pippa-loop>"


def _describe(args: dict[str, Any]) -> tuple[str, str]:
    to = ", ".join(str(a) for a in args.get("to", []))
    return to, f"subject {args.get('subject', '')!r}, {len(str(args.get('body', '')))} characters"


def _show(args: dict[str, Any]) -> list[Field]:
    """Who gets it, from whom, and every word of it."""
    fields = [Field("To", _addresses(args.get("to")))]
    if args.get("cc"):
        fields.append(Field("Cc", _addresses(args["cc"])))
    sender = args.get("from") or f"{settings.DEFAULT_FROM_EMAIL} (the default sender)"
    fields.append(Field("From", str(sender)))
    fields.append(Field("Subject", str(args.get("subject", ""))))
    fields.append(Field("Body", str(args.get("body", ""))))
    return fields


def _addresses(value: Any) -> str:
    return ", ".join(str(a) for a in value) if isinstance(value, list) else str(value or "")


def _probe(args: dict[str, Any], effect_id: str) -> ProbeResult:
    """The file backend keeps what it sent: look for the Message-ID there."""
    if settings.EMAIL_BACKEND != "django.core.mail.backends.filebased.EmailBackend":
        return ProbeResult(None, "an SMTP server cannot be asked what it received")
    wanted = f"Message-ID: {message_id(effect_id)}"
    folder = Path(settings.EMAIL_FILE_PATH)
    for path in sorted(folder.glob("*.log")) if folder.exists() else []:
        if wanted in path.read_text(errors="replace"):
            return ProbeResult(True, f"found in {path.name}", {"message_id": message_id(effect_id)})
    return ProbeResult(False, f"no message with that Message-ID under {folder}")


def _address_problem(text: str) -> str | None:
    _, address = email.utils.parseaddr(text)
    try:
        validate_email(address)
    except ValidationError:
        return f"{text[:80]!r} is not an email address"
    return "has a line break" if any(c in text for c in "\r\n") else None


def _check(args: dict[str, Any]) -> list[str]:
    problems = []
    if args["to"] == []:
        problems.append("args.to: must name at least one recipient")
    for field in ("to", "cc"):
        for index, item in enumerate(args.get(field) or []):
            problem = _address_problem(item) if fixed(item) else None
            if problem:
                problems.append(f"args.{field}[{index}]: {problem}")
    sender = args.get("from")
    problem = _address_problem(sender) if sender and fixed(sender) else None
    if problem:
        problems.append(f"args.from: {problem}")
    if fixed(args["subject"]) and any(c in args["subject"] for c in "\r\n"):
        problems.append("args.subject: has a line break")
    return problems


@tool(
    "email.send",
    args={
        "to": Arg("list", items="string"),
        "subject": Arg("string"),
        "body": Arg("string"),
        "cc": Arg("list", required=False, items="string"),
        "from": Arg("string", required=False),
    },
    side_effect=True,
    describe=_describe,
    show=_show,
    probe=_probe,
    check=_check,
)
def email_send(args: dict[str, Any], effect_id: str) -> dict[str, Any]:
    if not args["to"]:
        raise EffectRejected("'to' must name at least one recipient")
    mid = message_id(effect_id)
    message = EmailMessage(
        subject=args["subject"],
        body=args["body"],
        from_email=args.get("from") or settings.DEFAULT_FROM_EMAIL,
        to=args["to"],
        cc=args.get("cc") or [],
        headers={"Message-ID": mid},
    )
    connection = get_connection(fail_silently=False)
    try:
        connection.open()
    except smtplib.SMTPAuthenticationError as exc:  # an OSError too: it must come first
        raise EffectRejected(f"the mail server refused our login: {exc}") from exc
    except (OSError, socket.gaierror) as exc:  # refused, DNS, TLS, HELO: before any message
        raise EffectNotSent(f"could not reach the mail server: {exc}") from exc
    try:
        message.connection = connection
        message.send()
    except smtplib.SMTPRecipientsRefused as exc:
        # Every recipient refused before DATA: nothing was delivered. 4xx codes say "later".
        codes = [code for code, _ in exc.recipients.values()]
        if codes and all(400 <= code < 500 for code in codes):
            raise EffectNotSent(f"the mail server deferred every recipient: {exc}") from exc
        raise EffectRejected(f"the mail server refused the recipients: {exc}") from exc
    except smtplib.SMTPSenderRefused as exc:
        if 400 <= exc.smtp_code < 500:
            raise EffectNotSent(f"the mail server deferred the sender: {exc}") from exc
        raise EffectRejected(f"the mail server refused the sender: {exc}") from exc
    except smtplib.SMTPDataError as exc:
        if 400 <= exc.smtp_code < 500:
            raise EffectNotSent(f"the mail server deferred the message: {exc}") from exc
        raise EffectRejected(f"the mail server refused the message: {exc}") from exc
    finally:
        try:
            connection.close()
        except Exception:  # noqa: S110 - the outcome is already decided
            pass
    return {"message_id": mid}
