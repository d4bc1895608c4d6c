"""Read-only built-ins: echo, sleep."""

from __future__ import annotations

import time
from typing import Any

from .base import Arg, ToolError, fixed, tool


@tool("echo", args={"value": Arg("any")})
def echo(args: dict[str, Any]) -> dict[str, Any]:
    return {"value": args["value"]}


def _check_sleep(args: dict[str, Any]) -> list[str]:
    seconds = args["seconds"]
    if fixed(seconds) and not 0 <= seconds <= 24 * 3600:
        return ["args.seconds: must be between 0 and 86400"]
    return []


@tool("sleep", args={"seconds": Arg("number")}, check=_check_sleep)
def sleep(args: dict[str, Any]) -> dict[str, Any]:
    seconds = float(args["seconds"])
    if not 0 <= seconds <= 24 * 3600:
        raise ToolError("'seconds' must be between 0 and 86400")
    time.sleep(seconds)
    return {"slept": seconds}
