"""What a person is shown of a tool call: labelled fields, each in full.

An answer is for what Dad saw (DESIGN.md §5), so a tool's `show(args)` lists everything a person
needs to decide about its call — an email's recipients, subject and body; an HTTP call's method,
URL, headers and body — never a digest or a cut. Plain data: the pages fold long fields (the
text stays whole in the page), the CLI indents them, the API sends them as they are.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

# A field longer than this folds on a page: a short preview, and the whole text on a click.
FOLD_CHARS = 1000
FOLD_LINES = 30
PREVIEW_LINES = 5
PREVIEW_CHARS = 400


@dataclass(frozen=True)
class Field:
    label: str
    text: str
    # "text": prose as written (a subject, a body); "code": exact characters in a fixed-width
    # font (a URL, a command, SQL, a path, headers); "json": pretty-printed JSON.
    format: str = "text"

    def as_dict(self) -> dict[str, str]:
        return {"label": self.label, "text": self.text, "format": self.format}

    @property
    def lines(self) -> int:
        return self.text.count("\n") + 1

    @property
    def block(self) -> bool:
        """Shown as a block of its own (a body, JSON), not beside its label."""
        return self.format == "json" or "\n" in self.text or len(self.text) > 100

    @property
    def long(self) -> bool:
        return len(self.text) > FOLD_CHARS or self.lines > FOLD_LINES

    @property
    def preview(self) -> str:
        """The first lines, for a folded field; the page says how much more there is."""
        head = "\n".join(self.text.splitlines()[:PREVIEW_LINES])
        return head if len(head) <= PREVIEW_CHARS else head[:PREVIEW_CHARS]

    @property
    def size(self) -> str:
        chars = len(self.text)
        words = [f"{chars:,} character{'s' if chars != 1 else ''}"]
        if self.lines > 1:
            words.append(f"{self.lines:,} lines")
        return ", ".join(words)


def json_text(value: Any) -> str:
    """JSON for people: indented, unicode kept, keys in the order given."""
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


def pretty(value: Any) -> str:
    """JSON for people, the same every time: indented, unicode kept, keys sorted ("" for
    None). Rendered escaped by the templates."""
    if value is None:
        return ""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)


def value_field(label: str, value: Any) -> Field:
    if isinstance(value, str):
        return Field(label, value)
    return Field(label, json_text(value), "json")


def default(args: Any) -> list[Field]:
    """Every argument in full, for a tool that does not say how to show its calls."""
    if not isinstance(args, dict):
        return [value_field("Arguments", args)]
    return [value_field(str(name), value) for name, value in args.items()]


def as_text(fields: list[Field], indent: str = "") -> list[str]:
    """Plain-text lines for a terminal: a short field beside its label, a block under it,
    each of its lines behind a bar. Control characters (a hostile body's terminal escapes) are
    written out as escapes, never sent to the terminal."""
    lines = []
    for field in fields:
        if not field.block:
            lines.append(f"{indent}{field.label}: {terminal_safe(field.text)}")
            continue
        lines.append(f"{indent}{field.label}: ({field.size})")
        lines.extend(f"{indent}  | {terminal_safe(line)}" for line in field.text.split("\n"))
    return lines


def terminal_safe(text: str) -> str:
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode(), text)


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")
