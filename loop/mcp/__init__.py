"""Pippa's tools from MCP servers (DESIGN.md §18), and Pippa Loop as an MCP server.

config    the operator's servers file (LOOP_MCP_SERVERS), validated at start
sessions  the SDK's sessions, kept open by one thread and reconnected; how far a call got
catalog   each server's tools as loop tools `mcp.<server>.<tool>`, Dad's decision of which
          are side effects; every side-effect call goes through the one outbox (effects)
serve     Pippa Loop's own MCP server (`manage.py mcp_server`, /mcp): the API's actions
"""
