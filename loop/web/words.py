"""Plain words at display (issue 28): what the loop stores for itself, said to a person.

The loop keeps its errors as it met them ("TransientError: [Errno 111] Connection refused") and
its actors as ids ("cli:root", "worker:3"): exact, and what the journal and the logs need. A page
shows them through two template filters, builtins of every template (settings.TEMPLATES):

    {{ text|plain }}    an error or detail in words: no exception class names, no errno, no
                        setting names (LOOP_…), no 64-character digests (cut to their first 8)
    {{ actor|who }}     a person by their display name (the User's full name, else the
                        username); the loop's own processes, agents and schedules in words

Both are pure but for `who`'s lookup of a username (one indexed query per person and request).
"""

from __future__ import annotations

import re
import threading

from django import template
from django.core.signals import request_finished, request_started

register = template.Library()

# An exception's class, as Python names it, at the head of a message or after "where: ".
_CLASS = re.compile(
    r"\b(?:[a-z_]+\.)*([A-Z][A-Za-z]*(?:Error|Exception|Timeout|Refused|Reset|Warning)|"
    r"gaierror|herror|timeout)\b:?\s*"
)
_ERRNO = re.compile(r"\[Errno -?\d+\]\s*")
_SETTING = re.compile(r"\b(LOOP_[A-Z0-9_]+)\b(=?)")
_DIGEST = re.compile(r"\b([0-9a-f]{8})[0-9a-f]{56}\b")
_ACTOR = re.compile(r"\b(?:cli|worker|boot|admin):[\w.@:-]+")

# What a class name meant, when no message follows it ("TimeoutError" alone).
CLASS_WORDS = {
    "ConnectionRefusedError": "the other side refused the connection",
    "ConnectionResetError": "the other side dropped the connection",
    "ConnectionAbortedError": "the connection was cut",
    "TimeoutError": "no answer in time",
    "ReadTimeout": "no answer in time",
    "ConnectTimeout": "could not connect in time",
    "timeout": "no answer in time",
    "gaierror": "no such host name",
    "PermissionError": "not allowed",
    "FileNotFoundError": "no such file",
}

# The settings a message may name, as what they are; any other is "a site setting".
SETTING_WORDS = {
    "LOOP_HTTP_ALLOW": "the hosts the loop may call",
    "LOOP_HTTP_PROBE_URL": "the address that checks whether a call arrived",
    "LOOP_SITE_ADDRESSES": "the site's own address",
    "LOOP_FILE_ROOT": "the folder the loop may write in",
    "LOOP_SMTP_HOST": "the mail server",
    "LOOP_MAX_ATTEMPTS": "the number of tries a step has",
    "LOOP_WORKER_LATE_AFTER": "late after, in seconds",
    "LOOP_SHELL_ENABLED": "the site's switch for shell commands",
}

# Messages whose whole meaning is better said otherwise (checked after the cuts above).
PHRASES = [
    (
        re.compile(r"connection refused", re.I),
        "connection refused (nothing answers at that address)",
    ),
    (re.compile(r"name or service not known|nodename nor servname", re.I), "no such host name"),
    (re.compile(r"\btick failed\b", re.I), "the loop's pass failed"),
    (re.compile(r"\bnext tick\b", re.I), "next pass of the loop"),
    (re.compile(r"\bstanding authorization\b", re.I), "the schedule's permission"),
    (re.compile(r"\bsuperseded\b", re.I), "replaced"),
    (re.compile(r"\bsupersede\b", re.I), "replace"),
]


def plain_error(text: object) -> str:
    """`text` with the machine's words turned into a person's (see the module's docstring)."""
    said = str(text or "")
    if not said:
        return ""

    def class_words(match: re.Match[str]) -> str:
        # The class's meaning only where no message follows it to say it.
        said_after = match.string[match.end() :].strip()
        words = "" if said_after else CLASS_WORDS.get(match.group(1), "")
        return words

    said = _CLASS.sub(class_words, said)
    said = _ERRNO.sub("", said)
    said = _SETTING.sub(
        lambda m: SETTING_WORDS.get(m.group(1), "a site setting") + (": " if m.group(2) else ""),
        said,
    )
    said = _DIGEST.sub(lambda m: f"{m.group(1)}…", said)
    said = _ACTOR.sub(lambda m: person(m.group(0)), said)
    for pattern, words in PHRASES:
        said = pattern.sub(words, said)
    said = re.sub(r"(:\s*){2,}", ": ", said)
    return re.sub(r"\s{2,}", " ", said).strip(" :")


class _Names(threading.local):
    """Display names looked up during the request being served (cleared as it starts and
    ends), so a page with a hundred journal rows asks once per person, not once per row;
    outside a request nothing is kept."""

    kept: dict[str, str] | None = None


_names = _Names()


def _start_keeping(**kwargs: object) -> None:
    _names.kept = {}


def _stop_keeping(**kwargs: object) -> None:
    _names.kept = None


request_started.connect(_start_keeping, dispatch_uid="loop.web.words.start")
request_finished.connect(_stop_keeping, dispatch_uid="loop.web.words.stop")


def _display_name(username: str) -> str:
    """The person's display name: their full name if the site knows one, else the username;
    '' if the site has no such account."""
    kept = _names.kept
    if kept is not None and username in kept:
        return kept[username]
    from django.contrib.auth.models import User

    user = User.objects.filter(username=username).only("first_name", "last_name").first()
    name = "" if user is None else (user.get_full_name().strip() or username)
    if kept is not None:
        kept[username] = name
    return name


def person(actor: object) -> str:
    """Who did something, as a person would name them (an actor id as the journal keeps it)."""
    said = str(actor or "")
    kind, sep, rest = said.partition(":")
    if not sep:
        if said in {"", "system", "bootstrap"}:
            return "the loop"
        if said == "pippa":
            return "Pippa"
        return _display_name(said) or said
    if kind in {"cli", "admin", "web", "user"}:
        if kind != "cli":
            return _display_name(rest) or rest
        # The operator at the shell is named by the site account of the same name, if any
        # ("cli:dad" is Dad); "root" and other machine accounts are the operator.
        name = _display_name(rest)
        return f"{name} (command line)" if name else "the operator (command line)"
    if kind in {"worker", "boot"}:
        return "the loop"
    if kind == "agent":
        return f"agent {rest}"
    if kind == "schedule":
        return f"schedule {rest}"
    return said


register.filter("plain", plain_error)
register.filter("who", person)
