"""Secrets by name (DESIGN.md §19): a plan, an agent or the model writes `${secret:NAME}` in a
tool's arguments, never the value.

Where a value comes from: the environment, `PIPPA_SECRET_<NAME>`, else the file the setting
LOOP_SECRETS_FILE names (a JSON object of strings, or `NAME=value` lines; `#` starts a comment
line). The file is the operator's and private: owned by the user the loop runs as and readable
by no one else (mode 0600 or narrower), or it is not read at all. It is read again when it
changes, so a secret added or removed needs no restart.

What flows where:

    step args, effect request (and so its id), transcript, question, journal, the model
        -> the reference, `${secret:NAME}`; shown to a person as "[secret NAME]" (`shown`)
    the tool's run, at the moment it is called (`loop.tools.base` wraps every registered
    tool's run, start and probe)
        -> the value, filled in (`resolve`); an unknown name fails the call, naming it
    what the run returns or raises (an output, a receipt, an error, a probe's evidence)
        -> every value it used written back as "[secret NAME]" (`redact`), as it is, JSON-
           escaped or percent-encoded: a receiver that echoes a header keeps no secret here

A plan naming a secret that does not exist is refused when it is written (`problems`, asked by
`Tool.check_args`); one that has vanished since fails its step when it runs (`loop.tools.base`
wraps each tool's run, start and probe in `resolve` and `guarded`). Pure: no Django models;
the setting is read at each look-up.
"""

from __future__ import annotations

import json
import os
import re
import stat
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

REFERENCE = re.compile(r"\$\{secret:([^}]*)\}")
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
ENVIRONMENT = "PIPPA_SECRET_"
SETTING = "LOOP_SECRETS_FILE"
WHERE = f"{ENVIRONMENT}<NAME> or {SETTING}"
_PRINTABLE = "".join(map(chr, range(0x21, 0x7F)))


class SecretError(ValueError):
    """A secret can't be had: an unknown name, a name that is not one, or a store that can't be
    read (the message names it, never a value)."""


# ---- the store ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Read:
    key: tuple[int, int, int, int]  # (device, inode, size, mtime_ns): the file as it was read
    values: dict[str, str]


_last: _Read | None = None


def _setting() -> str:
    from django.conf import settings

    return str(getattr(settings, SETTING, "") or "")


def read_file(path: str) -> dict[str, str]:
    """The secrets in the file at `path`; SecretError naming the file (and the line or key)
    unless it is private and reads."""
    global _last
    where = f"{SETTING} {path}"
    try:
        with open(path, "rb") as file:
            info = os.fstat(file.fileno())
            mode = stat.S_IMODE(info.st_mode)
            if mode & 0o077 or info.st_uid != os.geteuid():
                raise SecretError(
                    f"{where}: must be private to the user the loop runs as (mode 0600, owned "
                    f"by uid {os.geteuid()}), not mode {mode:04o} of uid {info.st_uid}; it was "
                    "not read"
                )
            key = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
            if _last is not None and _last.key == key:
                return _last.values
            raw = file.read()
    except OSError as exc:
        raise SecretError(f"{where}: can't be read ({exc.strerror})") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise SecretError(f"{where}: not UTF-8 text") from None
    values = _parse(text, where)
    _last = _Read(key, values)
    return values


def _parse(text: str, where: str) -> dict[str, str]:
    if text.lstrip().startswith("{"):
        try:
            found = json.loads(text)
        except ValueError as exc:
            raise SecretError(f"{where}: not valid JSON (line {_line(exc)})") from None
        if not isinstance(found, dict):
            raise SecretError(f"{where}: must be one JSON object of names to strings")
        items = list(found.items())
        bad = [str(k) for k, v in items if not isinstance(v, str)]
        if bad:
            raise SecretError(f"{where}: the value of {bad[0]!r} must be a string")
    else:
        items = []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            name, equals, value = line.partition("=")
            if not equals:
                raise SecretError(f"{where}: line {number} is not NAME=value")
            items.append((name.strip(), value))
    values = {}
    for name, value in items:
        if not NAME.fullmatch(name):
            raise SecretError(f"{where}: {name[:40]!r} is not a secret's name ({NAME.pattern})")
        values[name] = value
    return values


def _line(exc: ValueError) -> int:
    return int(getattr(exc, "lineno", 0))


def lookup(name: str) -> str | None:
    """The value of the secret `name`, or None if neither the environment nor the file has it;
    SecretError if the file can't be read."""
    if not NAME.fullmatch(name):
        return None
    found = os.environ.get(ENVIRONMENT + name)
    if found is not None:
        return found
    path = _setting()
    return read_file(path).get(name) if path else None


# ---- references -----------------------------------------------------------------------------


def _strings(value: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """(path, text) of every string inside `value`: `headers.Authorization`, `to[0]`."""
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, dict):
        for key, inner in value.items():
            yield from _strings(inner, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            yield from _strings(inner, f"{path}[{index}]")


def problems(args: Any) -> list[str]:
    """What is wrong with the secrets `args` refer to ("args.headers.Authorization: no secret
    'PAY' (…)"), each once; [] if every one exists. A reference in a field's name (a dict key)
    is refused: a name is shown to a person and kept as it is."""
    found = []
    if isinstance(args, dict):
        keys = [(p, k) for p, k in _keys(args) if REFERENCE.search(k)]
        found += [f"args.{p or k}: a secret can't be the name of a field" for p, k in keys]
    for path, text in _strings(args):
        for match in REFERENCE.finditer(text):
            name = match.group(1)
            if not NAME.fullmatch(name):
                found.append(f"args.{path}: {name[:40]!r} is not a secret's name ({NAME.pattern})")
                continue
            try:
                known = lookup(name) is not None
            except SecretError as exc:
                found.append(f"args.{path}: {exc}")
                continue
            if not known:
                found.append(f"args.{path}: no secret '{name}' ({WHERE})")
    return list(dict.fromkeys(found))


def _keys(value: Any, path: str = "") -> Iterator[tuple[str, str]]:
    if isinstance(value, dict):
        for key, inner in value.items():
            here = f"{path}.{key}" if path else str(key)
            yield path, str(key)
            yield from _keys(inner, here)
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            yield from _keys(inner, f"{path}[{index}]")


def resolve(value: Any) -> tuple[Any, dict[str, str]]:
    """`value` with every `${secret:NAME}` filled in, and the values used by name; SecretError
    naming the first that can't be (an unknown name, one that has vanished since the plan was
    written, a store that can't be read)."""
    used: dict[str, str] = {}

    def fill(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in used:
            found = lookup(name)
            if found is None:
                raise SecretError(f"no secret '{name}' ({WHERE}): nothing was sent")
            used[name] = found
        return used[name]

    def walk(item: Any) -> Any:
        if isinstance(item, str):
            return REFERENCE.sub(fill, item) if "${secret:" in item else item
        if isinstance(item, dict):
            return {k: walk(v) for k, v in item.items()}
        if isinstance(item, list):
            return [walk(v) for v in item]
        return item

    return walk(value), used


def shown(text: str) -> str:
    """`text` as a person reads it: each reference as "[secret NAME]"."""
    return REFERENCE.sub(lambda m: f"[secret {m.group(1)}]", text)


# ---- keeping values out of what is stored ---------------------------------------------------


def _spellings(used: dict[str, str]) -> list[tuple[str, str]]:
    """(how a value may appear, what replaces it), longest first: as it is, JSON-escaped and
    percent-encoded (a receiver that echoes a URL or a body)."""
    found: dict[str, str] = {}
    for name, value in used.items():
        if not value:
            continue
        marker = f"[secret {name}]"
        for spelling in (
            value,
            json.dumps(value)[1:-1],
            json.dumps(value, ensure_ascii=False)[1:-1],
            urllib.parse.quote(value, safe=""),
            urllib.parse.quote(value),
            urllib.parse.quote_plus(value),
            urllib.parse.quote(value, safe=_PRINTABLE),  # as a URL's path goes out (receivers)
        ):
            found.setdefault(spelling, marker)
    return sorted(found.items(), key=lambda pair: -len(pair[0]))


def redact(value: Any, used: dict[str, str]) -> Any:
    """`value` (any JSON) with every secret in `used` written as "[secret NAME]", in its keys
    and strings alike."""
    spellings = _spellings(used)
    if not spellings:
        return value

    def text(item: str) -> str:
        for spelling, marker in spellings:
            if spelling in item:
                item = item.replace(spelling, marker)
        return item

    def walk(item: Any) -> Any:
        if isinstance(item, str):
            return text(item)
        if isinstance(item, dict):
            return {text(str(k)) if isinstance(k, str) else k: walk(v) for k, v in item.items()}
        if isinstance(item, list | tuple):
            return [walk(v) for v in item]
        return item

    return walk(value)


def scrub(exc: BaseException, used: dict[str, str]) -> None:
    """Redact the secrets in `used` from an exception's message, and those of the exceptions it
    was raised from, in place: its type (which decides what became of a call) stays."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        current.args = tuple(redact(a, used) if isinstance(a, str) else a for a in current.args)
        if isinstance(current, OSError):
            for attribute in ("strerror", "filename", "filename2"):
                found = getattr(current, attribute, None)
                if isinstance(found, str):
                    setattr(current, attribute, redact(found, used))
        current = current.__cause__ or current.__context__


# ---- a call, with its secrets ---------------------------------------------------------------

T = TypeVar("T")


def guarded(call: Callable[[], T], used: dict[str, str]) -> T:
    """What `call()` returns, redacted of the secrets in `used`; what it raises, scrubbed."""
    try:
        result = call()
    except BaseException as exc:
        scrub(exc, used)
        raise
    return redact(result, used) if used else result  # type: ignore[no-any-return]
