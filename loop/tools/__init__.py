"""The tools: named verbs a judge calls (DESIGN.md §13), one module per family, each
registering its tools with the `@tool` decorator of `loop.tools.base`.

Any installed app can add tools in its own `tools.py` with the same decorator; the registry
imports them when Django starts (`LoopConfig.ready`).
"""

from __future__ import annotations

from .base import (
    Arg,
    Call,
    ProbeResult,
    Tool,
    ToolError,
    TransientError,
    add_finder,
    calling,
    current_call,
    expand,
    find,
    fixed,
    get,
    is_reference,
    names,
    register,
    storable,
    tool,
    unregister,
)

__all__ = [
    "Arg",
    "Call",
    "ProbeResult",
    "Tool",
    "ToolError",
    "TransientError",
    "add_finder",
    "calling",
    "current_call",
    "expand",
    "find",
    "fixed",
    "get",
    "is_reference",
    "load_builtin",
    "names",
    "register",
    "storable",
    "tool",
    "unregister",
]


def load_builtin() -> None:
    from . import basic, files, http, mail, shell, sql  # noqa: F401 - they register themselves
