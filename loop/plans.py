"""Plan files (YAML or JSON), validated whole before anything is written.

    title: Pay the plumber
    steps:
      - {key: quote, tool: http.get, args: {url: "https://…"}}
      - {key: pay, tool: http.post, args: {url: "…", json: "${quote.body}"}, confirm_before: true}

Every error names the step and the field; a plan with any error creates nothing.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import yaml
from django.conf import settings

from . import tools

KEY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
REF_RE = re.compile(r"\$\{([A-Za-z0-9][A-Za-z0-9_-]*)((?:\.[A-Za-z0-9_-]+)*)\}")
STEP_FIELDS = {"key", "title", "tool", "args", "side_effect", "confirm_before", "max_attempts"}
PLAN_FIELDS = {"title", "schedule", "steps"}


class PlanError(Exception):
    def __init__(self, errors: list[str]) -> None:
        super().__init__("; ".join(errors))
        self.errors = errors


@dataclass(frozen=True)
class StepSpec:
    key: str
    title: str
    tool: str
    args: dict[str, Any]
    side_effect: bool
    confirm_before: bool
    max_attempts: int


@dataclass(frozen=True)
class PlanSpec:
    title: str
    steps: list[StepSpec] = field(default_factory=list)


def load(text: str) -> Any:
    """Parse JSON or YAML text (JSON is YAML, but JSON errors read better as JSON)."""
    stripped = text.lstrip()
    if stripped.startswith(("{", "[")):
        try:
            return json.loads(text)
        except ValueError as exc:
            raise PlanError([f"plan: not valid JSON: {exc}"]) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PlanError([f"plan: not valid YAML: {exc}"]) from None


def parse(text: str) -> PlanSpec:
    return validate(load(text))


def validate(data: Any) -> PlanSpec:
    if not isinstance(data, dict):
        raise PlanError(["plan: must be an object with 'title' and 'steps'"])
    errors = [f"plan: unknown field '{name}'" for name in data if name not in PLAN_FIELDS]
    title = data.get("title")
    if not isinstance(title, str) or not title.strip():
        errors.append("title: required, a non-empty string")
    elif len(title) > 200:
        errors.append("title: at most 200 characters")
    if data.get("schedule") is not None:
        errors.append("schedule: schedules are not supported by this version")
    steps = validate_steps(data.get("steps"), errors=errors)
    if errors:
        raise PlanError(errors)
    return PlanSpec(title=str(title).strip(), steps=steps)


def validate_steps(
    raw_steps: Any, *, earlier: frozenset[str] = frozenset(), errors: list[str] | None = None
) -> list[StepSpec]:
    """Validate a list of steps. `earlier` are keys of steps already in the task, which the
    new steps may refer to. Raises PlanError unless the caller collects `errors`."""
    collect = errors if errors is not None else []
    if not isinstance(raw_steps, list) or not raw_steps:
        collect.append("steps: required, a non-empty list")
        raw_steps = []
    seen = set(earlier)
    specs = []
    for index, raw in enumerate(raw_steps):
        spec = _validate_step(index, raw, seen, collect)
        if spec is not None:
            specs.append(spec)
    if errors is None and collect:
        raise PlanError(collect)
    return specs


def _validate_step(index: int, raw: Any, seen: set[str], errors: list[str]) -> StepSpec | None:
    where = f"steps[{index}]"
    if not isinstance(raw, dict):
        errors.append(f"{where}: must be an object")
        return None
    key = raw.get("key")
    if isinstance(key, str) and KEY_RE.match(key):
        where = f"step '{key}'"
        if key in seen:
            errors.append(f"{where}: key is used twice")
        seen.add(key)
    else:
        errors.append(f"{where}: 'key' is required: letters, digits, '_', '-', '.' (max 100)")
    before = len(errors)
    for name in raw:
        if name not in STEP_FIELDS:
            errors.append(f"{where}: unknown field '{name}'")
    title = raw.get("title", "")
    if not isinstance(title, str) or len(title) > 200:
        errors.append(f"{where}: 'title' must be a string of at most 200 characters")
    tool_name = raw.get("tool")
    tool = None
    if not isinstance(tool_name, str):
        errors.append(f"{where}: 'tool' is required")
    else:
        try:
            tool = tools.get(tool_name)
        except tools.ToolError:
            errors.append(
                f"{where}: unknown tool '{tool_name}' (known: {', '.join(tools.names())})"
            )
    args = raw.get("args", {})
    if tool is not None:
        errors.extend(tool.check_args(args, where))
        reason = tool.disabled()
        if reason:
            errors.append(f"{where}: tool '{tool.name}' is off: {reason}")
    for ref in references(args):
        if ref not in seen or ref == key:
            errors.append(f"{where}: args refer to '{ref}', which is not an earlier step")
    side_effect = raw.get("side_effect", tool.side_effect if tool else False)
    if not isinstance(side_effect, bool):
        errors.append(f"{where}: 'side_effect' must be true or false")
    elif tool is not None and tool.side_effect and not side_effect:
        errors.append(f"{where}: tool '{tool.name}' has side effects; 'side_effect' can't be false")
    confirm_before = raw.get("confirm_before", settings.LOOP_CONFIRM_SIDE_EFFECTS)
    if not isinstance(confirm_before, bool):
        errors.append(f"{where}: 'confirm_before' must be true or false")
    max_attempts = raw.get("max_attempts", settings.LOOP_MAX_ATTEMPTS)
    if (
        isinstance(max_attempts, bool)
        or not isinstance(max_attempts, int)
        or not 1 <= max_attempts <= 100
    ):
        errors.append(f"{where}: 'max_attempts' must be a whole number from 1 to 100")
    if len(errors) > before or not isinstance(key, str) or tool is None:
        return None
    return StepSpec(
        key=key,
        title=title or key,
        tool=tool.name,
        args=args,
        side_effect=bool(side_effect),
        confirm_before=bool(confirm_before) and bool(side_effect),
        max_attempts=int(max_attempts),
    )


def references(value: Any) -> set[str]:
    """The step keys named by `${key…}` anywhere inside `value`."""
    if isinstance(value, str):
        return {match.group(1) for match in REF_RE.finditer(value)}
    if isinstance(value, dict):
        return set().union(*(references(v) for v in value.values())) if value else set()
    if isinstance(value, list):
        return set().union(*(references(v) for v in value)) if value else set()
    return set()


def resolve(value: Any, outputs: dict[str, Any]) -> Any:
    """Fill `${key.path}` from earlier outputs: a whole-string reference takes the value as it
    is (any JSON); a reference inside a longer string is written as text."""
    if isinstance(value, dict):
        return {k: resolve(v, outputs) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve(v, outputs) for v in value]
    if not isinstance(value, str) or "${" not in value:
        return value
    whole = REF_RE.fullmatch(value)
    if whole:
        return _lookup(whole, outputs)

    def text(match: re.Match[str]) -> str:
        found = _lookup(match, outputs)
        return found if isinstance(found, str) else json.dumps(found)

    return REF_RE.sub(text, value)


def _lookup(match: re.Match[str], outputs: dict[str, Any]) -> Any:
    key, path = match.group(1), match.group(2)
    if key not in outputs:
        raise tools.ToolError(f"'{key}' has no output (is it done?)")
    found = outputs[key]
    for part in filter(None, path.split(".")):
        if isinstance(found, dict) and part in found:
            found = found[part]
        elif isinstance(found, list) and part.isdigit() and int(part) < len(found):
            found = found[int(part)]
        else:
            raise tools.ToolError(f"'{key}{path}': no '{part}' in that output")
    return found
