"""shell.run (a side effect, off unless LOOP_SHELL_ENABLED): run a program in the sandbox.

`argv` is executed directly (no shell parsing) in the sandbox of `loop.tools.sandbox`: the file
root appears at /files and is the one place it can write; `cwd` is a folder under it (the root
itself by default); stdin is closed; the environment is PATH, HOME=/files, LANG, PWD and
PIPPA_EFFECT_ID, nothing of the worker's. No network unless the step says `network: true` and
LOOP_SHELL_NETWORK allows it. Its stdout and stderr are each kept up to
LOOP_SHELL_OUTPUT_BYTES, and a cut one says so. With no sandbox to run in, the tool is off and
says why.

A command that ran and exited nonzero is a result, not an error: it did run, and its
`returncode` says how it went. A program that cannot be started did not run (rejected; not
sent, and tried again, when the sandbox could not start it for now). One killed at its timeout
may have done part of its work: uncertain.
"""

from __future__ import annotations

import shlex
from typing import Any

from django.conf import settings

from ..outcomes import EffectNotSent, EffectRejected, EffectUncertainError
from . import sandbox
from .base import Arg, ToolError, fixed, storable, tool
from .files import confined
from .shown import Field

DEFAULT_TIMEOUT = 60.0


def _disabled() -> str | None:
    if not settings.LOOP_SHELL_ENABLED:
        return "shell.run is disabled; set LOOP_SHELL_ENABLED=true to allow it"
    return sandbox.unavailable(sandbox.Room.configured())


def _describe(args: dict[str, Any]) -> tuple[str, str]:
    argv = [str(a) for a in args.get("argv") or []]
    text = " ".join(argv)
    return (argv[0] if argv else ""), (text if len(text) <= 200 else text[:199] + "…")


def _show(args: dict[str, Any]) -> list[Field]:
    """The program and its arguments exactly as they will be passed (quoted where needed),
    and where it runs."""
    argv = [str(a) for a in args.get("argv") or []]
    fields = [Field("Command", shlex.join(argv), "code")]
    fields.append(Field("Folder", str(args.get("cwd") or ".") + " (under the file root)", "code"))
    if "timeout" in args:
        fields.append(Field("Timeout", f"{args['timeout']} seconds"))
    if args.get("network") is True:
        fields.append(Field("Network", "the host's network"))
    return fields


def _timeout(args: dict[str, Any]) -> float:
    timeout = float(args.get("timeout", DEFAULT_TIMEOUT))
    if not 0 < timeout <= settings.LOOP_STEP_TIMEOUT:
        raise ToolError(f"'timeout' must be above 0 and at most {settings.LOOP_STEP_TIMEOUT}")
    return timeout


def _network_refused(args: dict[str, Any]) -> str | None:
    if args.get("network") is True and not settings.LOOP_SHELL_NETWORK:
        return "commands get no network; set LOOP_SHELL_NETWORK=true to allow asking for it"
    return None


def _text(output: sandbox.Output) -> str:
    text = storable(output.kept.decode("utf-8", errors="replace"))
    if output.cut:
        text += (
            f"\n… (cut: {output.total} bytes written, the first {len(output.kept)} kept;"
            " LOOP_SHELL_OUTPUT_BYTES)"
        )
    return text


def _check(args: dict[str, Any]) -> list[str]:
    problems = []
    if args["argv"] == []:
        problems.append("args.argv: must name a program")
    if fixed(args.get("cwd", ".")):
        try:
            confined(args.get("cwd", "."))
        except (ToolError, ValueError):
            problems.append("args.cwd: outside the file root")
    if fixed(args.get("timeout")):
        try:
            _timeout(args)
        except ToolError as exc:
            problems.append("args.timeout: " + str(exc).removeprefix("'timeout' "))
    if refused := _network_refused(args):
        problems.append("args.network: " + refused)
    return problems


@tool(
    "shell.run",
    args={
        "argv": Arg("list", items="string"),
        "cwd": Arg("string", required=False),
        "timeout": Arg("number", required=False),
        "network": Arg("boolean", required=False),
    },
    side_effect=True,
    describe=_describe,
    show=_show,
    disabled=_disabled,
    check=_check,
)
def shell_run(args: dict[str, Any], effect_id: str) -> dict[str, Any]:
    if reason := _disabled():  # checked again at the moment it would run
        raise ToolError(reason)
    argv = args["argv"]
    if not argv:
        raise ToolError("'argv' must name a program")
    if refused := _network_refused(args):
        raise ToolError(f"'network': {refused}")
    timeout = _timeout(args)
    room = sandbox.Room.configured()
    assert room.root is not None
    room.root.mkdir(parents=True, exist_ok=True)
    cwd = confined(args.get("cwd", "."))
    if not cwd.is_dir():
        raise ToolError(f"'cwd': no folder {args.get('cwd', '.')!r} under the file root")
    command = sandbox.Command(
        argv=tuple(argv),
        cwd=str(cwd.relative_to(room.root)),
        timeout=timeout,
        network=args.get("network") is True,
        effect_id=effect_id,
    )
    try:
        ran = sandbox.run(room, command)
    except sandbox.NeverStarted as exc:
        if exc.again:
            raise EffectNotSent(str(exc)) from exc
        raise EffectRejected(str(exc)) from exc
    except sandbox.TimedOut as exc:
        raise EffectUncertainError(str(exc)) from exc
    return {"returncode": ran.returncode, "stdout": _text(ran.stdout), "stderr": _text(ran.stderr)}
