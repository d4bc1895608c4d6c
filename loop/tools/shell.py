"""shell.run (a side effect, off unless LOOP_SHELL_ENABLED): run a program, no shell in between.

`argv` is executed directly (no shell parsing), in `cwd` under LOOP_FILE_ROOT (the root itself
by default), with stdin closed and a small environment (PATH, HOME, LANG): the worker's own
secrets (database URL, mail password, API keys) are not handed to the command.

A command that ran and exited nonzero is a result, not an error: it did run, and its
`returncode` says how it went. A program that cannot be started did not run (rejected). One
killed at its timeout may have done part of its work: uncertain.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
from typing import Any

from django.conf import settings

from ..outcomes import EffectRejected, EffectUncertainError
from .base import Arg, ToolError, fixed, storable, tool
from .files import confined
from .shown import Field

DEFAULT_TIMEOUT = 60.0
MAX_OUTPUT = 100_000


def _disabled() -> str | None:
    if settings.LOOP_SHELL_ENABLED:
        return None
    return "shell.run is disabled; set LOOP_SHELL_ENABLED=true to allow it"


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
    return fields


def _timeout(args: dict[str, Any]) -> float:
    timeout = float(args.get("timeout", DEFAULT_TIMEOUT))
    if not 0 < timeout <= settings.LOOP_STEP_TIMEOUT:
        raise ToolError(f"'timeout' must be above 0 and at most {settings.LOOP_STEP_TIMEOUT}")
    return timeout


def _text(raw: bytes) -> str:
    text = storable(raw.decode("utf-8", errors="replace"))
    return text if len(text) <= MAX_OUTPUT else text[:MAX_OUTPUT] + "\n… (cut)"


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
    return problems


@tool(
    "shell.run",
    args={
        "argv": Arg("list", items="string"),
        "cwd": Arg("string", required=False),
        "timeout": Arg("number", required=False),
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
    timeout = _timeout(args)
    cwd = confined(args.get("cwd", "."))
    if not cwd.is_dir():
        raise ToolError(f"'cwd': no folder {args.get('cwd', '.')!r} under the file root")
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(cwd),
        "LANG": "C.UTF-8",
        "PIPPA_EFFECT_ID": effect_id,
    }
    try:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own process group: a timeout kills its children too
        )
    except OSError as exc:  # no such program, not executable: it never started
        raise EffectRejected(f"can't run {argv[0]!r}: {exc.strerror or exc}") from exc
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise EffectUncertainError(
            f"{argv[0]!r} ran past its timeout of {timeout:g}s and was killed"
        ) from exc
    return {"returncode": proc.returncode, "stdout": _text(stdout), "stderr": _text(stderr)}
