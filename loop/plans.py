"""Plan files (YAML or JSON), validated whole before anything is written.

    title: Pay the plumber
    steps:
      - {key: quote, tool: http.get, args: {url: "https://…"}}
      - {key: pay, tool: http.post, args: {url: "…", json: "${quote.body}"}, confirm_before: true}

Every error names the step and the field; a plan with any error creates nothing.
"""

from __future__ import annotations

import codecs
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import yaml
from django.conf import settings

from . import cron, tools

KEY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
REF_RE = re.compile(r"\$\{([A-Za-z0-9][A-Za-z0-9_-]*)((?:\.[A-Za-z0-9_-]+)*)\}")
STEP_FIELDS = {
    "key",
    "title",
    "tool",
    "args",
    "side_effect",
    "confirm_before",
    "max_attempts",
    "judge",
    "instructions",
    "tools",
}
PLAN_FIELDS = {"title", "schedule", "timezone", "steps", "judge", "instructions"}
JUDGES = ("tool", "model")


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
    judge: str = "tool"
    instructions: str = ""
    tools: tuple[str, ...] = ()


@dataclass(frozen=True)
class PlanSpec:
    title: str
    steps: list[StepSpec] = field(default_factory=list)
    instructions: str = ""
    # A plan with `schedule` makes a schedule, not a task: its runs make tasks from `template`
    # (the plan without schedule and timezone, validated again at each run).
    schedule: str | None = None
    timezone: str | None = None
    template: dict[str, Any] | None = None


# ---- safe input --------------------------------------------------------------------------------
# Every door (the CLI, the dashboard, the API, the admin) reads plans and JSON bodies through
# here: UTF-8 only, bounded in bytes and depth, and only JSON values (no YAML aliases, dates,
# binary, sets; no NaN or Infinity; no integer beyond ±2**63; string keys only).

INT_BOUND = 2**63
BOUND_HINT = "integers must be within ±2**63"
FINITE_HINT = "numbers must be finite"
_BOMS = {
    codecs.BOM_UTF32_LE: "UTF-32",
    codecs.BOM_UTF32_BE: "UTF-32",
    codecs.BOM_UTF16_LE: "UTF-16",
    codecs.BOM_UTF16_BE: "UTF-16",
}


class _Refused(Exception):
    """Raised from inside a parser: the whole message, ready for PlanError."""


def max_bytes() -> int:
    return int(settings.LOOP_PLAN_MAX_BYTES)


def max_depth() -> int:
    return int(settings.LOOP_PLAN_MAX_DEPTH)


def decode(raw: bytes | str, what: str = "plan", limit: int | None = None) -> str:
    """`raw` as text: UTF-8 (a UTF-8 byte-order mark is dropped), at most `limit` bytes."""
    size = len(raw) if isinstance(raw, bytes) else len(raw.encode("utf-8", "surrogatepass"))
    if limit is not None and size > limit:
        raise PlanError([f"{what}: larger than the limit of {limit} bytes (LOOP_PLAN_MAX_BYTES)"])
    if isinstance(raw, str):
        return raw
    for bom, name in _BOMS.items():
        if raw.startswith(bom):
            raise PlanError(
                [
                    f"{what}: the text is {name} (it starts with a {name} byte-order mark); save it as UTF-8"
                ]
            )
    if b"\x00" in raw:
        raise PlanError(
            [
                f"{what}: the text has NUL bytes (UTF-16 without a byte-order mark?); save it as UTF-8"
            ]
        )
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        byte = raw[exc.start]
        raise PlanError(
            [f"{what}: not UTF-8 text (byte 0x{byte:02x} at offset {exc.start}); save it as UTF-8"]
        ) from None


def load(text: bytes | str) -> Any:
    """Parse a plan document, JSON or YAML (JSON is YAML, but JSON errors read better as
    JSON), from bytes or text; PlanError (`plan: ...`) for anything unreadable. What is not a
    JSON value is left in place for `validate` / `validate_steps`, which refuse it by name."""
    text = decode(text, "plan", max_bytes())
    if text.lstrip().startswith(("{", "[")):
        return _json(text, "plan")
    return _yaml(text)


def load_json(raw: bytes | str, what: str = "body", depth: int | None = None) -> Any:
    """Strict JSON (an API body): UTF-8, finite numbers, bounded integers, nested at most
    `depth` levels (default LOOP_PLAN_MAX_DEPTH)."""
    data = _json(decode(raw, what), what)
    problem = check_value(data, what, limit=None, depth=depth)
    if problem:
        raise PlanError([problem])
    return data


@dataclass(frozen=True)
class _NotJson:
    """A value the parser met that is not JSON; `check_value` refuses it, naming where."""

    what: str
    hint: str
    line: int = 0

    def __str__(self) -> str:
        at = f" (line {self.line})" if self.line else ""
        return f"{self.what} is not allowed{at}; {self.hint}"


def _json(text: str, what: str) -> Any:
    def number(digits: str) -> Any:
        if len(digits.lstrip("-")) > 19:
            return _NotJson(f"the integer {digits[:12]}… ({len(digits)} digits)", BOUND_HINT)
        return int(digits)

    def real(digits: str) -> Any:
        value = float(digits)
        return value if math.isfinite(value) else _NotJson(digits[:20], FINITE_HINT)

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        found = dict(items)
        if len(found) != len(items):
            twice = next(k for i, (k, _) in enumerate(items) if k in dict(items[:i]))
            raise _Refused(f"{what}: the key {twice!r} appears twice in one object")
        return found

    try:
        return json.loads(
            text,
            parse_constant=lambda name: _NotJson(name, FINITE_HINT),
            parse_int=number,
            parse_float=real,
            object_pairs_hook=pairs,
        )
    except _Refused as exc:
        raise PlanError([str(exc)]) from None
    except RecursionError:
        raise PlanError([f"{what}: nested more than {max_depth()} levels deep"]) from None
    except ValueError as exc:
        raise PlanError([f"{what}: not valid JSON: {exc}"]) from None


# libyaml where installed (ten times faster), else the pure-Python parser; either way only
# SafeConstructor's types are built, and `_screen` has read the events first.
_Parser: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_Parser):  # type: ignore[misc,valid-type]
    """The safe loader, minus what is not JSON (dates, binary, sets, NaN/Infinity, huge
    integers, a key given twice): each is refused by name when the plan is validated."""

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else id(key_node)
            if key in seen:
                line = key_node.start_mark.line + 1
                raise _Refused(f"plan: the key {key!r} appears twice in one mapping (line {line})")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _screen(text: str) -> None:
    """Refuse aliases and anchors (a few hundred bytes of them expand to gigabytes) and deep
    nesting, from the event stream alone: before anything is composed or built."""
    depth, deepest = 0, max_depth()
    for event in yaml.parse(text, Loader=_Parser):
        line = event.start_mark.line + 1 if event.start_mark else 0
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise _Refused(f"plan: YAML aliases (&/*) are not allowed (line {line})")
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > deepest:
                raise _Refused(f"plan: nested more than {deepest} levels deep (line {line})")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def _not_json(what: str) -> Callable[[_Loader, Any], Any]:
    def construct(loader: _Loader, node: Any) -> Any:
        return _NotJson(what, "quote it to make it a string", node.start_mark.line + 1)

    return construct


for _tag, _what in [
    ("timestamp", "a YAML date"),
    ("binary", "YAML !!binary"),
    ("set", "a YAML !!set"),
    ("omap", "a YAML !!omap"),
    ("pairs", "YAML !!pairs"),
]:
    _Loader.add_constructor(f"tag:yaml.org,2002:{_tag}", _not_json(_what))


def _yaml_int(loader: _Loader, node: Any) -> Any:
    if len(str(node.value).replace("_", "").lstrip("+-")) > 19:
        return _NotJson(f"the integer {node.value[:12]}…", BOUND_HINT, node.start_mark.line + 1)
    return loader.construct_yaml_int(node)


def _yaml_float(loader: _Loader, node: Any) -> Any:
    value = float(loader.construct_yaml_float(node))
    if not math.isfinite(value):
        return _NotJson(str(node.value)[:20], FINITE_HINT, node.start_mark.line + 1)
    return value


_Loader.add_constructor("tag:yaml.org,2002:int", _yaml_int)
_Loader.add_constructor("tag:yaml.org,2002:float", _yaml_float)


def _yaml(text: str) -> Any:
    try:
        _screen(text)
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader is a SafeLoader
    except _Refused as exc:
        raise PlanError([str(exc)]) from None
    except RecursionError:
        raise PlanError([f"plan: nested more than {max_depth()} levels deep"]) from None
    except yaml.YAMLError as exc:
        raise PlanError([f"plan: not valid YAML: {exc}"]) from None


def check_value(
    value: Any,
    what: str,
    *,
    limit: int | None | Literal["plan"] = "plan",
    depth: int | None = None,
    steps: bool = False,
) -> str | None:
    """What is wrong with `value` as stored JSON, naming where (`what`, then the path), or
    None. `limit` bounds its expanded size (default LOOP_PLAN_MAX_BYTES); with `steps`, the
    value is a list of steps and a path into one names it by its key."""
    size_limit = max_bytes() if limit == "plan" else limit
    deepest = depth or max_depth()
    size = 0
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(value, ())]
    while stack:
        item, path = stack.pop()
        size += 1
        problem = None
        if len(path) >= deepest:
            problem = f"nested more than {deepest} levels deep"
        elif isinstance(item, str):
            size += len(item)
            problem = _bad_string(item)
        elif isinstance(item, bool) or item is None:
            pass
        elif isinstance(item, int):
            if not -INT_BOUND < item < INT_BOUND:
                problem = f"{str(item)[:12]}… is not allowed; {BOUND_HINT}"
        elif isinstance(item, float):
            if not math.isfinite(item):
                problem = f"{item} is not allowed; {FINITE_HINT}"
        elif isinstance(item, dict):
            for key, inner in item.items():
                if not isinstance(key, str):
                    problem = f"the key {str(key)[:40]!r} is not a string (quote it)"
                    break
                problem = _bad_string(key)
                if problem:
                    problem = f"the key {key[:40]!r}: {problem}"
                    break
                size += len(key)
                stack.append((inner, (*path, key)))
        elif isinstance(item, list):
            stack.extend((inner, (*path, i)) for i, inner in enumerate(item))
        elif isinstance(item, _NotJson):
            problem = str(item)
        else:
            problem = f"a {type(item).__name__} is not a JSON value"
        if problem:
            return f"{_where(value, path, what, steps)}: {problem}"
        if size_limit is not None and size > size_limit:
            return f"{what}: more than {size_limit} bytes once expanded (LOOP_PLAN_MAX_BYTES)"
    return None


def _bad_string(text: str) -> str | None:
    if "\x00" in text:
        return "a NUL character (\\u0000) can't be stored"
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return "a lone surrogate (\\ud800-\\udfff) is not text"
    return None


def _where(root: Any, path: tuple[str | int, ...], what: str, steps: bool) -> str:
    """`step 'pay': args.amount` for a path into a plan's steps, else `what: a.b[0]`."""
    if not steps and path[:1] == ("steps",) and isinstance(root, dict):
        root, path, steps = root.get("steps"), path[1:], True
    label = ""
    if steps and path and isinstance(path[0], int) and isinstance(root, list):
        raw = root[path[0]]
        key = raw.get("key") if isinstance(raw, dict) else None
        label = (
            f"step '{key}'" if isinstance(key, str) and KEY_RE.match(key) else f"steps[{path[0]}]"
        )
        path = path[1:]
    elif steps:
        label = "steps"
    shown = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path[:8]).lstrip(".")
    if len(path) > 8:
        shown += "…"
    if label:
        return f"{label}: {shown}" if shown else label
    return shown or what


def parse(text: bytes | str) -> PlanSpec:
    return validate(load(text))


def validate(data: Any) -> PlanSpec:
    if not isinstance(data, dict):
        raise PlanError(["plan: must be an object with 'title' and 'steps'"])
    problem = check_value(data, "plan")
    if problem:
        raise PlanError([problem])
    errors = [f"plan: unknown field '{name}'" for name in data if name not in PLAN_FIELDS]
    title = data.get("title")
    if not isinstance(title, str) or not title.strip():
        errors.append("title: required, a non-empty string")
    elif len(title) > 200:
        errors.append("title: at most 200 characters")
    schedule, zone = _schedule(data, errors)
    judge = data.get("judge")
    if judge is not None and judge not in JUDGES:
        errors.append("judge: must be 'tool' or 'model'")
        judge = None
    instructions = data.get("instructions", "")
    if not isinstance(instructions, str):
        errors.append("instructions: must be a string")
        instructions = ""
    steps = validate_steps(data.get("steps"), errors=errors, judge=judge)
    if errors:
        raise PlanError(errors)
    template = None
    if schedule is not None:
        template = {k: v for k, v in data.items() if k not in ("schedule", "timezone")}
    return PlanSpec(
        title=str(title).strip(),
        steps=steps,
        instructions=instructions,
        schedule=schedule,
        timezone=zone,
        template=template,
    )


def _schedule(data: dict[str, Any], errors: list[str]) -> tuple[str | None, str | None]:
    schedule, zone = data.get("schedule"), data.get("timezone")
    if schedule is None:
        if zone is not None:
            errors.append("timezone: only with 'schedule'")
        return None, None
    if zone is None:
        zone = settings.TIME_ZONE
    if not isinstance(schedule, str) or not schedule.strip():
        errors.append("schedule: must be a cron expression, such as '0 8 * * MON'")
        return None, None
    if not isinstance(zone, str):
        errors.append("timezone: must be a time zone name, such as 'Europe/Berlin'")
        return None, None
    found = cron.check(schedule.strip(), zone)
    errors.extend(found)
    return (None, None) if found else (schedule.strip(), zone)


def validate_steps(
    raw_steps: Any,
    *,
    earlier: frozenset[str] = frozenset(),
    errors: list[str] | None = None,
    judge: str | None = None,
) -> list[StepSpec]:
    """Validate a list of steps. `earlier` are keys of steps already in the task, which the
    new steps may refer to; `judge` is the plan's, for each step without a `tool` (or a
    `judge` of its own). Raises PlanError unless the caller collects `errors`."""
    collect = errors if errors is not None else []
    problem = None if errors is not None else check_value(raw_steps, "steps", steps=True)
    if problem:
        raise PlanError([problem])
    if not isinstance(raw_steps, list) or not raw_steps:
        collect.append("steps: required, a non-empty list")
        raw_steps = []
    seen = set(earlier)
    specs = []
    for index, raw in enumerate(raw_steps):
        spec = _validate_step(index, raw, seen, collect, judge)
        if spec is not None:
            specs.append(spec)
    if errors is None and collect:
        raise PlanError(collect)
    return specs


def _validate_step(
    index: int, raw: Any, seen: set[str], errors: list[str], plan_judge: str | None = None
) -> StepSpec | None:
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
    judge = raw.get("judge", plan_judge if "tool" not in raw else None) or "tool"
    if judge not in JUDGES:
        errors.append(f"{where}: 'judge' must be 'tool' or 'model'")
    if judge == "model":
        return _model_step(where, key, raw, title, errors, before)
    if "tools" in raw:
        errors.append(f"{where}: 'tools' is for a model step ('judge: model')")
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


def _model_step(
    where: str, key: Any, raw: dict[str, Any], title: str, errors: list[str], before: int
) -> StepSpec | None:
    """A step the model judge performs (DESIGN.md §12): `instructions` say what to do, `tools`
    name what it may use (the read-only built-ins when left out); a side-effect tool only on
    a `side_effect: true` step."""
    if not settings.LOOP_LLM_BASE_URL:
        errors.append(f"{where}: 'judge: model' needs a model: LOOP_LLM_BASE_URL is not set")
    for name in ("tool", "args"):
        if name in raw:
            errors.append(f"{where}: '{name}' is for the tool judge; a model step has 'tools'")
    instructions = raw.get("instructions")
    if not isinstance(instructions, str) or not instructions.strip():
        errors.append(f"{where}: 'instructions' is required for a model step, a non-empty string")
    side_effect = raw.get("side_effect", False)
    if not isinstance(side_effect, bool):
        errors.append(f"{where}: 'side_effect' must be true or false")
        side_effect = False
    names = raw.get("tools", [])
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        errors.append(f"{where}: 'tools' must be a list of tool names")
        names = []
    for name in names:
        found = tools.find(name)
        if found is None:
            errors.append(
                f"{where}: tools: unknown tool '{name}' (known: {', '.join(tools.names())})"
            )
        elif found.side_effect and not side_effect:
            errors.append(
                f"{where}: tools: '{name}' has side effects; the step needs 'side_effect: true'"
            )
        elif found.disabled():
            errors.append(f"{where}: tools: '{name}' is off: {found.disabled()}")
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
    if len(errors) > before or not isinstance(key, str):
        return None
    return StepSpec(
        key=key,
        title=title or key,
        tool="",
        args={},
        side_effect=side_effect,
        confirm_before=bool(confirm_before) and side_effect,
        max_attempts=int(max_attempts),
        judge="model",
        instructions=str(instructions),
        tools=tuple(dict.fromkeys(names)),
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
