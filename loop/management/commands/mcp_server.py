"""Pippa Loop as an MCP server on stdio (loop/mcp/serve.py), for a desktop assistant or any MCP
client: each tool is one request to the HTTP API as the agent whose token PIPPA_AGENT_TOKEN
holds (made with `manage.py agent_token`), with that agent's permissions and receipts."""

from __future__ import annotations

import os
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from loop.mcp import serve


class Command(BaseCommand):
    help = "Serve Pippa Loop's tasks and conversation over MCP on stdio (PIPPA_AGENT_TOKEN)."

    def handle(self, *args: Any, **options: Any) -> None:
        bearer = os.environ.get("PIPPA_AGENT_TOKEN", "").strip()
        if not bearer:
            raise CommandError(
                "PIPPA_AGENT_TOKEN: required, an agent token (manage.py agent_token)"
            )
        serve.token.set(bearer)
        serve.build().run("stdio")
