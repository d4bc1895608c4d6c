"""The operator's MCP servers (DESIGN.md §18): the file LOOP_MCP_SERVERS names, JSON or YAML.

    servers:
      NAME:                       # letters, digits, '_' and '-'; tools are mcp.NAME.<tool>
        command: [prog, arg, ...] # a stdio server, started by the worker, or
        env: {KEY: value}         #   its extra environment (values may be ${secret:NAME})
        url: https://host/mcp     # a streamable-HTTP server
        headers: {Name: value}    #   sent with each request (values may be ${secret:NAME})
        read_only: [tool, ...]    # Dad's word: these tools change nothing in the world
        safe_to_repeat: [tool, ...]  # Dad's word: calling these twice is the same as once
        trusted: false            # the server's own annotations count only when true
        timeout: 60               # seconds a call may take

Validated when the site starts (`load` raises ConfigError naming the field); pure: no Django.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

NAME = re.compile(r"[A-Za-z0-9_-]{1,40}")
KEYS = {"command", "env", "url", "headers", "read_only", "safe_to_repeat", "trusted", "timeout"}


class ConfigError(ValueError):
    """The servers file is not what it must be; the message names the field."""


@dataclass(frozen=True)
class Server:
    name: str
    command: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    url: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    read_only: frozenset[str] = frozenset()
    safe_to_repeat: frozenset[str] = frozenset()
    trusted: bool = False
    timeout: float = 60.0

    @property
    def transport(self) -> str:
        return "stdio" if self.command else "http"

    @property
    def where(self) -> str:
        """Where the server is, as the tools page shows it (the headers' values are not)."""
        return " ".join(self.command) if self.command else self.url


def load(path: str) -> dict[str, Server]:
    """The servers the file at `path` configures, by name; ConfigError naming the field."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"LOOP_MCP_SERVERS: can't read {path}: {exc.strerror}") from None
    return parse(text, where=f"LOOP_MCP_SERVERS ({path})")


def parse(text: str, where: str = "LOOP_MCP_SERVERS") -> dict[str, Server]:
    try:
        data = json.loads(text)
    except ValueError:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{where}: neither JSON nor YAML: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("servers"), dict):
        raise ConfigError(f"{where}: 'servers' must be an object of servers by name")
    extra = set(data) - {"servers"}
    if extra:
        raise ConfigError(f"{where}: unknown field '{sorted(extra)[0]}'")
    return {
        name: _server(name, spec, f"{where}: servers.{name}")
        for name, spec in data["servers"].items()
    }


def _server(name: Any, spec: Any, where: str) -> Server:
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ConfigError(f"{where}: a server's name is 1-40 letters, digits, '_' or '-'")
    if not isinstance(spec, dict):
        raise ConfigError(f"{where}: must be an object")
    unknown = set(spec) - KEYS
    if unknown:
        raise ConfigError(f"{where}.{sorted(unknown)[0]}: unknown field")
    has_command, has_url = "command" in spec, "url" in spec
    if has_command == has_url:
        raise ConfigError(f"{where}: needs exactly one of 'command' (stdio) or 'url' (HTTP)")
    command: tuple[str, ...] = ()
    url = ""
    if has_command:
        command = tuple(_strings(spec["command"], f"{where}.command"))
        if not command:
            raise ConfigError(f"{where}.command: must name a program")
        if "headers" in spec:
            raise ConfigError(f"{where}.headers: only for a 'url' server")
    else:
        url = spec["url"]
        if not isinstance(url, str) or not re.match(r"https?://[^/\s]+", url):
            raise ConfigError(f"{where}.url: must be an http:// or https:// URL")
        if "env" in spec:
            raise ConfigError(f"{where}.env: only for a 'command' server")
    trusted = spec.get("trusted", False)
    if not isinstance(trusted, bool):
        raise ConfigError(f"{where}.trusted: must be true or false")
    timeout = spec.get("timeout", 60)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout <= 3600:
        raise ConfigError(f"{where}.timeout: must be a number of seconds, 0 < timeout <= 3600")
    return Server(
        name=name,
        command=command,
        env=_mapping(spec.get("env", {}), f"{where}.env"),
        url=url,
        headers=_mapping(spec.get("headers", {}), f"{where}.headers"),
        read_only=frozenset(_strings(spec.get("read_only", []), f"{where}.read_only")),
        safe_to_repeat=frozenset(
            _strings(spec.get("safe_to_repeat", []), f"{where}.safe_to_repeat")
        ),
        trusted=trusted,
        timeout=float(timeout),
    )


def _strings(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{where}: must be a list of non-empty strings")
    return list(value)


def _mapping(value: Any, where: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and k and isinstance(v, str) for k, v in value.items()
    ):
        raise ConfigError(f"{where}: must be an object of strings")
    return dict(value)
