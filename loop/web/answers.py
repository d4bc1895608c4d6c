"""Answers that talk back, on the dashboard (DESIGN.md §17): the fields of "Edit, then allow"
— each argument of the step's tool, as a person edits it — and the call they make back.

A text argument is a text box; a list of texts one item per line; anything else JSON. What
comes back is checked by the action as the tool's arguments (`actions.unblock`), so a wrong
value is refused naming its field, and nothing changes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .. import calls, tools, transcript
from ..models import Step

LONG = ("body", "content", "sql", "json")  # arguments shown as a large box


@dataclass(frozen=True)
class EditField:
    name: str
    kind: str  # "text", "lines" (a list of texts) or "json"
    value: str
    required: bool
    large: bool

    @property
    def input_name(self) -> str:
        return f"arg.{self.name}"

    @property
    def hint(self) -> str:
        return {"lines": "one per line", "json": "JSON"}.get(self.kind, "")


def editable(step: Step) -> list[EditField]:
    """The fields of the step's call, for "Edit, then allow" (a model step's: the call of
    Pippa's that waits); [] when there is none, or it can't be edited (a tool step's call with
    an effect beyond a first intent is fixed)."""
    if step.judge == "model":  # Pippa's call that waits, as she made it or Dad edited it
        call_id, name, args = transcript.pending(step)
        if not call_id:
            return []
        args = transcript.edit_of(step, call_id) or args
        tool = tools.find(name)
    else:
        tool = tools.find(step.tool) if step.tool else None
        if tool is None or calls.why_fixed(step):
            return []
        args = step.args
    if tool is None or not isinstance(args, dict):
        return []
    found = []
    for name, arg in tool.args.items():
        value = args.get(name)
        if arg.type == "string" and (value is None or isinstance(value, str)):
            kind, text = "text", value or ""
        elif arg.type == "list" and arg.items == "string" and _texts(value):
            kind, text = "lines", "\n".join(value or [])
        else:
            kind, text = "json", "" if value is None else json.dumps(value, indent=1)
        large = name in LONG or kind != "text" or "\n" in text or len(text) > 60
        found.append(EditField(name, kind, text, arg.required, large))
    return found


def _texts(value: Any) -> bool:
    return value is None or (isinstance(value, list) and all(isinstance(v, str) for v in value))


def edited_args(step: Step, data: Any) -> dict[str, Any]:
    """The call's arguments from the form's `arg.NAME` fields; an empty optional field is left
    out. ValueError naming the field whose JSON does not parse."""
    args: dict[str, Any] = {}
    for field in editable(step):
        raw = str(data.get(field.input_name, ""))
        if not raw.strip() and not field.required:
            continue
        if field.kind == "text":
            args[field.name] = raw.replace("\r\n", "\n")
        elif field.kind == "lines":
            args[field.name] = [line.strip() for line in raw.splitlines() if line.strip()]
        else:
            try:
                args[field.name] = json.loads(raw)
            except ValueError as exc:
                raise ValueError(f"args.{field.name}: not JSON: {exc}") from None
    return args
