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
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from . import cron, tools
from .models import Step, StepState
from .safe_input import (  # noqa: F401  (the plans' readers, used as plans.load_json etc.)
    KEY_RE,
    PlanError,
    check_value,
    decode,
    load,
    load_json,
    max_bytes,
    max_depth,
)

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
        if not isinstance(raw, dict):
            collect.append(f"steps[{index}]: must be an object")
            continue
        found = check_step(
            raw, where=f"steps[{index}]", earlier=seen, screened=True, plan_judge=judge
        )
        collect.extend(found.errors)
        key = raw.get("key")
        if isinstance(key, str) and KEY_RE.match(key):
            if key in seen:
                collect.append(f"step '{key}': key is used twice")
            seen.add(key)
        if found.spec is not None:
            specs.append(found.spec)
    if errors is None and collect:
        raise PlanError(collect)
    return specs


@dataclass(frozen=True)
class StepCheck:
    """What `check_step` found: the step as it will be stored (None if anything is wrong),
    and each problem as (the field it is about, the message naming the step and the field)."""

    spec: StepSpec | None
    problems: list[tuple[str, str]]

    @property
    def errors(self) -> list[str]:
        return [message for _, message in self.problems]


def check_step(
    fields: Mapping[str, Any],
    *,
    where: str,
    earlier: AbstractSet[str] | None = None,
    screened: bool = False,
    plan_judge: str | None = None,
) -> StepCheck:
    """The one check of a step's plan fields, for every door that writes them (a plan, added
    steps, the admin's edits through `actions.edit_steps`): `fields` are the step's fields as
    given (key, title, judge, tool, args, instructions, tools, side_effect, confirm_before,
    max_attempts); a field left out takes its default, and a step without a `tool` or a
    `judge` of its own takes the plan's (`plan_judge`). Errors name the step by its key, or by `where` while the key is not
    valid. `${key}` references in args must name a key in `earlier` (not checked when None);
    `screened` says the values were already checked as stored JSON (`check_value`).

    The stored step asks first only if it has side effects: `confirm_before` on a read-only
    step (as the setting LOOP_CONFIRM_SIDE_EFFECTS gives every step) means nothing."""
    problems: list[tuple[str, str]] = []
    key = fields.get("key")
    if isinstance(key, str) and KEY_RE.match(key):
        where = f"step '{key}'"
    else:
        problems.append(
            ("key", f"{where}: 'key' is required: letters, digits, '_', '-', '.' (max 100)")
        )
    if not screened:
        for name, value in fields.items():
            problem = check_value({name: value}, name)
            if problem:  # NaN, a NUL, too deep or too large: nothing the database should get
                problems.append((name, f"{where}: {problem}"))
        if problems:
            return StepCheck(None, problems)
    problems.extend(
        (name, f"{where}: unknown field '{name}'") for name in fields if name not in STEP_FIELDS
    )
    title = fields.get("title", "")
    if not isinstance(title, str) or len(title) > 200:
        problems.append(("title", f"{where}: 'title' must be a string of at most 200 characters"))
    judge = fields.get("judge", plan_judge if "tool" not in fields else None) or "tool"
    if judge not in JUDGES:
        problems.append(("judge", f"{where}: 'judge' must be 'tool' or 'model'"))
    if judge == "model":
        return _model_step(where, key, fields, title, problems)
    if "tools" in fields:
        problems.append(("tools", f"{where}: 'tools' is for a model step ('judge: model')"))
    tool_name = fields.get("tool")
    tool = None
    if not isinstance(tool_name, str):
        problems.append(("tool", f"{where}: 'tool' is required"))
    else:
        try:
            tool = tools.get(tool_name)
        except tools.ToolError:
            known = ", ".join(tools.names())
            problems.append(("tool", f"{where}: unknown tool '{tool_name}' (known: {known})"))
    args = fields.get("args", {})
    if tool is not None:
        problems.extend(_call_problems(tool, args, where))
    if earlier is not None:
        for ref in sorted(references(args)):
            if ref not in earlier or ref == key:
                problems.append(
                    ("args", f"{where}: args refer to '{ref}', which is not an earlier step")
                )
    side_effect = fields.get("side_effect", tool.side_effect if tool else False)
    if not isinstance(side_effect, bool):
        problems.append(("side_effect", f"{where}: 'side_effect' must be true or false"))
    elif tool is not None and tool.side_effect and not side_effect:
        problems.append(
            (
                "side_effect",
                f"{where}: tool '{tool.name}' has side effects; 'side_effect' can't be false",
            )
        )
    confirm_before, max_attempts = _attempt_fields(fields, where, problems)
    if problems or not isinstance(key, str) or tool is None:
        return StepCheck(None, problems)
    spec = StepSpec(
        key=key,
        title=title or key,
        tool=tool.name,
        args=args,
        side_effect=bool(side_effect),
        confirm_before=confirm_before and bool(side_effect),
        max_attempts=max_attempts,
    )
    return StepCheck(spec, problems)


def check_call(tool: tools.Tool, args: Any, *, where: str) -> list[str]:
    """What is wrong with calling `tool` with `args`: arguments that do not fit it, or the
    tool switched off. `check_step` asks this when a step is written; the judge asks again of
    the resolved args when the step runs, and the API of an agent's call (`/api/effects`)."""
    return [message for _, message in _call_problems(tool, args, where)]


def _call_problems(tool: tools.Tool, args: Any, where: str) -> list[tuple[str, str]]:
    found = [("args", problem) for problem in tool.check_args(args, where)]
    reason = tool.disabled()
    if reason:
        found.append(("tool", f"{where}: tool '{tool.name}' is off: {reason}"))
    return found


def _attempt_fields(
    fields: Mapping[str, Any], where: str, problems: list[tuple[str, str]]
) -> tuple[bool, int]:
    """`confirm_before` and `max_attempts`, as every step has them."""
    confirm_before = fields.get("confirm_before", settings.LOOP_CONFIRM_SIDE_EFFECTS)
    if not isinstance(confirm_before, bool):
        problems.append(("confirm_before", f"{where}: 'confirm_before' must be true or false"))
    max_attempts = fields.get("max_attempts", settings.LOOP_MAX_ATTEMPTS)
    if (
        isinstance(max_attempts, bool)
        or not isinstance(max_attempts, int)
        or not 1 <= max_attempts <= 100
    ):
        problems.append(
            ("max_attempts", f"{where}: 'max_attempts' must be a whole number from 1 to 100")
        )
    return bool(confirm_before), max_attempts if isinstance(max_attempts, int) else 1


def _model_step(
    where: str, key: Any, fields: Mapping[str, Any], title: str, problems: list[tuple[str, str]]
) -> StepCheck:
    """A step the model judge performs (DESIGN.md §12): `instructions` say what to do, `tools`
    name what it may use (the read-only built-ins when left out); a side-effect tool only on
    a `side_effect: true` step."""
    if not settings.LOOP_LLM_BASE_URL:
        message = f"{where}: 'judge: model' needs a model: LOOP_LLM_BASE_URL is not set"
        problems.append(("judge", message))
    for name in ("tool", "args"):
        if name in fields:
            message = f"{where}: '{name}' is for the tool judge; a model step has 'tools'"
            problems.append((name, message))
    instructions = fields.get("instructions")
    if not isinstance(instructions, str) or not instructions.strip():
        message = f"{where}: 'instructions' is required for a model step, a non-empty string"
        problems.append(("instructions", message))
    side_effect = fields.get("side_effect", False)
    if not isinstance(side_effect, bool):
        problems.append(("side_effect", f"{where}: 'side_effect' must be true or false"))
        side_effect = False
    names = fields.get("tools", [])
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        problems.append(("tools", f"{where}: 'tools' must be a list of tool names"))
        names = []
    for name in names:
        if name.endswith(".*"):
            if not tools.expand([name]):
                problems.append(("tools", f"{where}: tools: no tool is named '{name}'"))
            continue
        found = tools.find(name)
        if found is None:
            known = ", ".join(tools.names())
            problems.append(("tools", f"{where}: tools: unknown tool '{name}' (known: {known})"))
        elif found.side_effect and not side_effect:
            message = (
                f"{where}: tools: '{name}' has side effects; the step needs 'side_effect: true'"
            )
            problems.append(("tools", message))
        elif found.disabled():
            problems.append(("tools", f"{where}: tools: '{name}' is off: {found.disabled()}"))
    confirm_before, max_attempts = _attempt_fields(fields, where, problems)
    if problems or not isinstance(key, str):
        return StepCheck(None, problems)
    spec = StepSpec(
        key=key,
        title=title or key,
        tool="",
        args={},
        side_effect=side_effect,
        confirm_before=confirm_before and side_effect,
        max_attempts=max_attempts,
        judge="model",
        instructions=str(instructions),
        tools=tuple(dict.fromkeys(names)),
    )
    return StepCheck(spec, problems)


def resolved_args(step: Step) -> dict[str, Any]:
    """The stored step's args, their `${key.path}` references filled from earlier steps'
    outputs (ToolError if one cannot be): the call it makes when it runs."""
    keys = references(step.args)
    if not keys:
        return step.args
    # Only the steps named, through the index step_key_unique (task, key): never the whole plan.
    outputs = dict(
        Step.objects.filter(
            task_id=step.task_id, key__in=sorted(keys), state=StepState.DONE
        ).values_list("key", "output")
    )
    return resolve(step.args, outputs)


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
