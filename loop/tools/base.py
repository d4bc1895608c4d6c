"""What a tool is (a named verb with an argument schema and two flags), the registry, and the
call a tool runs under. The tool modules beside this one import it; `loop.tools` re-exports it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from functools import wraps
from typing import TYPE_CHECKING, Any, TypeVar

from django.conf import settings

from . import shown, vault

if TYPE_CHECKING:
    from ..models import Step

JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "number": (int, float),
    "integer": (int,),
    "boolean": (bool,),
    "object": (dict,),
    "list": (list,),
    "any": (object,),
}


class ToolError(Exception):
    """A definitive failure: bad arguments, a missing file, a tool that is switched off."""


class TransientError(Exception):
    """A read-only call that may work if tried again later."""


@dataclass(frozen=True)
class Arg:
    type: str = "any"
    required: bool = True
    items: str | None = None  # for lists: the type of each item


@dataclass(frozen=True)
class ProbeResult:
    """What a probe found in the world about an uncertain effect."""

    found: bool | None  # True happened, False not found, None unknown
    evidence: str
    response: dict[str, Any] | None = None


@dataclass(frozen=True)
class Tool:
    name: str
    run: Callable[..., dict[str, Any]]
    args: dict[str, Arg]
    side_effect: bool = False
    safe_to_repeat: bool = False
    # (args) -> (target, summary): this call in one line (an effect's row, the journal).
    describe: Callable[[dict[str, Any]], tuple[str, str]] | None = None
    # (args) -> fields: what a person needs to decide about this call, in full (`shown`).
    show: Callable[[dict[str, Any]], list[shown.Field]] | None = None
    # (args, effect_id) -> ProbeResult: read-only look in the world for an uncertain effect.
    probe: Callable[[dict[str, Any], str], ProbeResult] | None = None
    # () -> reason the tool is off, or None.
    disabled: Callable[[], str | None] = field(default=lambda: None)
    # (args, effect_id) -> finish: `run` in two halves, for a side-effect tool whose request
    # can go out before its answer is awaited (the outbox then sends a batch's requests first
    # and collects their answers after). `start` raises as `run` would; `finish()` returns or
    # raises what `run` would have.
    start: Callable[[dict[str, Any], str], Callable[[], dict[str, Any]]] | None = None
    # (args) -> whether the receiver of this call keeps what it did under the effect id and
    # answers a repeat from it, acting once (a table's primary key, an Idempotency-Key
    # receiver): then this call, like a safe-to-repeat kind's, is simply performed again.
    dedupes: Callable[[dict[str, Any]], bool] | None = None

    def repeatable(self, args: dict[str, Any]) -> bool:
        """Whether a cut of this call settles without a person: performing it again cannot
        make it happen twice (DESIGN.md §5). Decided from the call alone, before it starts;
        arguments the tool can't read are not repeatable (the judge refuses them anyway)."""
        if self.safe_to_repeat:
            return True
        try:
            return bool(self.dedupes and self.dedupes(args))
        except Exception:
            return False

    # (args) -> problems ("args.path: outside the file root") found without acting, once the
    # args fit the schema; a field holding a `${...}` reference is left for run time.
    check: Callable[[dict[str, Any]], list[str]] | None = None
    # A tool from elsewhere (an MCP server): its own words and its arguments' JSON Schema,
    # offered to the model as they are.
    description: str = ""
    input_schema: dict[str, Any] | None = None

    def check_args(self, args: Any, where: str) -> list[str]:
        """Errors naming `where` and the argument; empty when the args fit the schema."""
        if not isinstance(args, dict):
            return [f"{where}: args must be an object"]
        errors = []
        for name, spec in self.args.items():
            if name not in args:
                if spec.required:
                    errors.append(f"{where}: tool '{self.name}' needs '{name}'")
                continue
            if is_reference(args[name]):
                continue
            if not _fits(args[name], spec.type):
                errors.append(f"{where}: '{name}' must be {spec.type}")
            elif spec.items and any(
                not (_fits(i, spec.items) or is_reference(i)) for i in args[name]
            ):
                errors.append(f"{where}: every item of '{name}' must be {spec.items}")
        for name in args:
            if name not in self.args:
                errors.append(f"{where}: tool '{self.name}' takes no argument '{name}'")
        errors.extend(f"{where}: {problem}" for problem in vault.problems(args))
        if not errors and self.check is not None:
            errors.extend(f"{where}: {problem}" for problem in self.check(args))
        return errors

    def summary(self, args: dict[str, Any]) -> tuple[str, str]:
        """(target, summary): this call in one line, a secret shown by its name."""
        target, summary = self.describe(args) if self.describe is not None else ("", _short(args))
        return vault.shown(target), vault.shown(summary)

    def request_view(self, args: Any) -> list[shown.Field]:
        """The call as a person is shown it, every field in full but for a secret, shown as
        "[secret NAME]" (the only thing a person is not shown); every argument in full if
        `show` can't read these args (a reference not filled in, a value of the wrong type)."""
        fields = shown.default(args)
        if self.show is not None and isinstance(args, dict):
            try:
                fields = self.show(args)
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
        return [replace(f, text=vault.shown(f.text)) for f in fields]


def _fits(value: Any, type_name: str) -> bool:
    if type_name in {"number", "integer"} and isinstance(value, bool):
        return False
    return isinstance(value, JSON_TYPES[type_name])


def _short(value: Any, limit: int = 200) -> str:
    import json

    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def is_reference(value: Any) -> bool:
    return isinstance(value, str) and "${" in value


def storable(text: str) -> str:
    """Text a tool read from the world, as an output can hold it: PostgreSQL's jsonb refuses
    a NUL character, so each becomes U+FFFD."""
    return text.replace("\x00", "\ufffd")


def fixed(value: Any) -> bool:
    """No `${...}` reference anywhere inside: the value is known at plan time."""
    if isinstance(value, dict):
        return all(fixed(v) for v in value.values())
    if isinstance(value, list):
        return all(fixed(v) for v in value)
    return not is_reference(value)


@dataclass(frozen=True)
class Call:
    """The step a tool is running for, and the lease it runs under (see `current_call`)."""

    task_id: int
    step_id: int
    step_key: str
    attempt: int
    owner: int  # the lease holder (a worker's id, or an API agent's negative one)
    epoch: int  # the task's lease epoch: the fencing token of this run
    # A person wrote this call, or answered for it exactly: its `${secret:NAME}` are filled in
    # (`with_secrets`). Never for a call Pippa or an agent made up on their own.
    secrets: bool = False

    @classmethod
    def of(cls, step: Step, owner: int, epoch: int, *, covered: bool = False) -> Call:
        """The call of `step`; `covered`: a person's answer covers exactly this call."""
        return cls(
            step.task_id,
            step.pk,
            step.key,
            step.attempts,
            owner,
            epoch,
            secrets=covered or _persons_call(step),
        )


def _persons_call(step: Step) -> bool:
    """A tool step's call is a person's when a person (or a schedule's template) wrote it, or
    when it is a side effect that only runs once a person's answer covered its exact call (the
    guard's floor for steps Pippa or an agent wrote, off under LOOP_CONFIRM_PLANS=never)."""
    from ..models import PERSON_WRITERS

    if step.judge != "tool":
        return False  # a model step's calls are Pippa's, each covered only by an answer
    if step.writer in PERSON_WRITERS:
        return True
    return step.side_effect and settings.LOOP_CONFIRM_PLANS != "never"


_call: ContextVar[Call | None] = ContextVar("loop_tool_call", default=None)


def current_call() -> Call | None:
    """Inside a tool: which step, attempt and lease epoch this call belongs to (None when the
    tool is called outside a judge, e.g. from a plan check)."""
    return _call.get()


@contextmanager
def calling(call: Call) -> Iterator[None]:
    token = _call.set(call)
    try:
        yield
    finally:
        _call.reset(token)


_registry: dict[str, Tool] = {}
# Called with a name the registry does not know (tools from elsewhere are found when first
# named: `loop.mcp`); each may register it.
_finders: list[Callable[[str], None]] = []


def add_finder(finder: Callable[[str], None]) -> None:
    if finder not in _finders:
        _finders.append(finder)


def _found(name: str) -> Tool | None:
    if name not in _registry:
        for finder in _finders:
            finder(name)
    return _registry.get(name)


def unregister(name: str) -> None:
    """Forget a tool (a tool from elsewhere that is gone or changed)."""
    _registry.pop(name, None)


def expand(names: list[str]) -> list[str]:
    """`names` with each `prefix.*` replaced by every registered tool under `prefix.`
    (`mcp.files.*`), in order; other names as they are."""
    out: list[str] = []
    for name in names:
        if name.endswith(".*"):
            _found(name[:-1])  # lets a finder register the family
            prefix = name[:-1]
            out.extend(n for n in sorted(_registry) if n.startswith(prefix) and n not in out)
        elif name not in out:
            out.append(name)
    return out


def register(t: Tool) -> Tool:
    """Add `t` to the registry, its run, start and probe called with the secrets their args
    refer to filled in (`with_secrets`). The tool as registered."""
    if t.name in _registry:
        if _registry[t.name].run.__dict__.get("unresolved") is not t.run:
            raise ValueError(f"tool {t.name!r} is registered twice")
        return _registry[t.name]
    _registry[t.name] = registered = replace(
        t,
        run=with_secrets(t.run),
        start=with_secrets(t.start, later=True) if t.start is not None else None,
        probe=_probe_with_secrets(t.probe) if t.probe is not None else None,
    )
    return registered


F = TypeVar("F", bound=Callable[..., Any])


def with_secrets(run: F, *, later: bool = False) -> F:
    """`run(args, …)` called at the moment of the call with the secrets `args` refer to filled
    in (`vault.resolve`), and what it returns or raises redacted of them (`vault.guarded`);
    ToolError, before `run` is called, for a secret it can't have. `later`: `run` is a
    `Tool.start`, whose answer, awaited later, is redacted too."""

    @wraps(run)
    def call(args: Any, *rest: Any) -> Any:
        filled, used = _resolved(args)
        if not used:
            return run(args, *rest)
        asking = current_call()
        if asking is not None and not asking.secrets:
            names = ", ".join(sorted(used))
            raise ToolError(
                f"step '{asking.step_key}': ${{secret:{names}}} is filled in only in a call a "
                "person wrote or answered for exactly; Pippa and agents may not send secrets on "
                "their own"
            )
        result = vault.guarded(lambda: run(filled, *rest), used)
        if later:  # `result` is the function that awaits the answer
            return lambda: vault.guarded(result, used)
        return result

    call.__dict__["unresolved"] = run
    return call  # type: ignore[return-value]


def _resolved(args: Any) -> tuple[Any, dict[str, str]]:
    try:
        return vault.resolve(args)
    except vault.SecretError as exc:
        raise ToolError(str(exc)) from None


def _probe_with_secrets(
    probe: Callable[[dict[str, Any], str], ProbeResult],
) -> Callable[[dict[str, Any], str], ProbeResult]:
    """A probe that looks with the secrets of the effect's request, and tells what it found
    without them."""

    @wraps(probe)
    def look(args: dict[str, Any], effect_id: str) -> ProbeResult:
        try:
            filled, used = vault.resolve(args)
        except vault.SecretError as exc:
            return ProbeResult(None, f"the probe can't look: {exc}")
        found = vault.guarded(lambda: probe(filled, effect_id), used)
        if not used:
            return found
        return replace(
            found,
            evidence=vault.redact(found.evidence, used),
            response=vault.redact(found.response, used),
        )

    return look


def tool(
    name: str,
    *,
    args: dict[str, Arg],
    side_effect: bool = False,
    safe_to_repeat: bool = False,
    describe: Callable[[dict[str, Any]], tuple[str, str]] | None = None,
    show: Callable[[dict[str, Any]], list[shown.Field]] | None = None,
    probe: Callable[[dict[str, Any], str], ProbeResult] | None = None,
    disabled: Callable[[], str | None] | None = None,
    start: Callable[[dict[str, Any], str], Callable[[], dict[str, Any]]] | None = None,
    dedupes: Callable[[dict[str, Any]], bool] | None = None,
    check: Callable[[dict[str, Any]], list[str]] | None = None,
) -> Callable[[Callable[..., dict[str, Any]]], Callable[..., dict[str, Any]]]:
    """Register a function as a tool.

    Read-only tools are called `run(args)`; side-effect tools `run(args, effect_id)` and
    report their outcome by returning (success) or raising EffectNotSent / EffectRejected;
    any other exception means the outcome is uncertain.
    """

    def decorate(func: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
        register(
            Tool(
                name=name,
                run=func,
                args=args,
                side_effect=side_effect,
                safe_to_repeat=safe_to_repeat,
                describe=describe,
                show=show,
                probe=probe,
                disabled=disabled or (lambda: None),
                start=start,
                dedupes=dedupes,
                check=check,
            )
        )
        return func

    return decorate


def get(name: str) -> Tool:
    found = _found(name)
    if found is None:
        raise ToolError(f"unknown tool '{name}'")
    return found


def find(name: str) -> Tool | None:
    return _found(name)


def names() -> list[str]:
    return sorted(_registry)
