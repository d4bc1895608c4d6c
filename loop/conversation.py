"""The conversation (DESIGN.md §10): one ordered history of messages by users, agents and
schedules. Posting a message ends every standing authorization given before it."""

from __future__ import annotations

from typing import Any

from django.db import connection, transaction

from . import journal
from .models import AuthorKind, EventKind, Message, Step, Task, Writer
from .permissions import Who, require

MAX_TEXT = 10_000


class MessageError(ValueError):
    """The message is refused; nothing was posted."""


def post(*, author: str, kind: AuthorKind, text: str, user: Who) -> Message:
    """Append a message and journal it. Joins the caller's transaction if there is one (a
    schedule's run posts its message with its task)."""
    require(user, "write in the conversation", actor=author)
    if not isinstance(text, str) or not text.strip():
        raise MessageError("text: required, a non-empty string")
    if len(text) > MAX_TEXT:
        raise MessageError(f"text: at most {MAX_TEXT} characters")
    if not author:
        raise MessageError("author: required")
    with transaction.atomic():
        _in_commit_order()
        message = Message.objects.create(author=author[:150], author_kind=kind, text=text)
        journal.record(EventKind.MESSAGE_POSTED, actor=author, message=message.pk, author_kind=kind)
    return message


def _in_commit_order() -> None:
    """Messages get their ids in the order they commit, so "the latest message" is the latest
    word: on PostgreSQL a sequence hands out ids before commit, so a writer takes the table's
    write lock first (readers are not blocked) and holds it to its commit. SQLite has one
    writer at a time already."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f"LOCK TABLE {Message._meta.db_table} IN EXCLUSIVE MODE")


def latest_id() -> int | None:
    """The id of the conversation's latest message: one lookup on the primary key's index."""
    return Message.objects.order_by("-id").values_list("id", flat=True).first()


def standing(task: Task, step: Step) -> bool:
    """A standing authorization (§10) covers the step: it is of its schedule's template, as Dad
    wrote it (never one added since by Pippa or an agent), and the task was created by a
    schedule's run whose message is still the conversation's latest. Asked only when a step
    would ask "May I do this?" (one lookup on the messages' primary key)."""
    return (
        step.writer == Writer.SCHEDULE
        and task.origin_message_id is not None
        and task.origin_message_id == latest_id()
    )


def message_dict(message: Message) -> dict[str, Any]:
    return {
        "id": message.pk,
        "author": message.author,
        "author_kind": message.author_kind,
        "text": message.text,
        "at": message.created_at.isoformat(),
    }


def history(*, after: int = 0, limit: int | None = None) -> list[Message]:
    """Oldest first; with `limit`, the latest `limit` messages."""
    found = Message.objects.filter(id__gt=after)
    if limit is None:
        return list(found.order_by("id"))
    return list(reversed(found.order_by("-id")[:limit]))
