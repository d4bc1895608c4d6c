"""How far an MCP call got (DESIGN.md §6), as `sessions` tells it; pure, so that a process that
only reads these (a page, a plan check) never loads the SDK."""

from __future__ import annotations


class NotSent(Exception):
    """The call certainly did not reach the server (it could not be connected or pinged)."""


class Refused(Exception):
    """The server answered the call with an error: it did not do it."""


class Lost(Exception):
    """The call was written and its answer never came: it may have happened."""
