"""The loop's own time per MCP call, beside a bare SDK call to the same server in the same run.

    .venv/bin/python bench/mcp_overhead.py [--calls 200] [--steps 100]

One MCP server written with the SDK (tests/support/mcp_server.py) runs over stdio, twice: once
for a bare `ClientSession` (the floor: one tools/call round trip), once for the loop. Measured,
each as a median of per-call times (ms):

- bare SDK          session.call_tool('lookup') and ('put'), nothing else;
- loop, a call      the registered tool `mcp.b.lookup` / `mcp.b.put`'s run, as a judge calls it:
                    the session pool's thread hand-off and its ping before each call, the
                    result turned into an output (a side-effect call's effect id in _meta);
- loop, a step      whole tool steps through an in-process worker on SQLite, per step: the
                    read-only step (start commit, the call, verdict commit) and the side-effect
                    step through the outbox (intent, fenced claim, the call, the receipt, the
                    verdict: its commits are fsynced).

The figures are printed; the difference from the bare call is the loop's own cost.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SERVER = [sys.executable, str(ROOT / "tests" / "support" / "mcp_server.py"), "stdio"]


def setup(folder: Path) -> None:
    sys.path.insert(0, str(ROOT))
    config = folder / "mcp.json"
    config.write_text(
        json.dumps(
            {
                "servers": {
                    "b": {
                        "command": SERVER,
                        "env": {"MCP_LOG": str(folder / "calls.log")},
                        "read_only": ["lookup"],
                    }
                }
            }
        )
    )
    os.environ["PIPPA_DATA_DIR"] = str(folder)
    os.environ["DATABASE_URL"] = f"sqlite:///{folder / 'loop.sqlite3'}"
    os.environ["DJANGO_SETTINGS_MODULE"] = "pippa_site.settings"
    os.environ["LOOP_MCP_SERVERS"] = str(config)
    os.environ.setdefault("LOOP_LOG_LEVEL", "WARNING")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


WARM_UP = 30  # calls before the measured ones, on each side


def bare(calls: int, log: Path) -> dict[str, float]:
    import anyio
    from mcp import ClientSession, StdioServerParameters, stdio_client

    async def run() -> dict[str, float]:
        env = {"MCP_LOG": str(log)}  # the same server as the loop's, logging as it does
        params = StdioServerParameters(command=SERVER[0], args=SERVER[1:], env=env)
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            out = {}
            for tool, args in (("lookup", {"city": "Oslo"}), ("put", {"name": "x", "value": 1})):
                times = []
                for n in range(WARM_UP + calls):
                    start = time.perf_counter()
                    await session.call_tool(tool, args)
                    if n >= WARM_UP:
                        times.append(time.perf_counter() - start)
                out[tool] = statistics.median(times) * 1000
            return out

    return anyio.run(run)


def loop_calls(calls: int) -> dict[str, float]:
    from loop import tools

    out = {}
    for name, args in (
        ("mcp.b.lookup", {"city": "Oslo"}),
        ("mcp.b.put", {"name": "x", "value": 1}),
    ):
        tool = tools.get(name)
        times = []
        for n in range(WARM_UP + calls):
            start = time.perf_counter()
            if tool.side_effect:
                tool.run(args, f"bench-{n}")
            else:
                tool.run(args)
            if n >= WARM_UP:
                times.append(time.perf_counter() - start)
        out[name] = statistics.median(times) * 1000
    return out


def loop_steps(steps: int) -> dict[str, float]:
    from loop import actions, plans
    from loop.models import Event
    from loop.permissions import SYSTEM
    from loop.worker import Worker

    runner = Worker(label="bench")
    runner.boot()
    out = {}
    kinds: list[tuple[str, str, dict[str, Any], bool]] = [
        ("read-only", "mcp.b.lookup", {"city": "Oslo"}, False),
        ("side effect", "mcp.b.put", {"name": "x", "value": 1}, True),
    ]
    for label, tool, args, side in kinds:
        plan = {
            "title": label,
            "steps": [
                {"key": f"s{n}", "tool": tool, "args": {**args, **({"value": n} if side else {})}}
                for n in range(steps)
            ],
        }
        task = actions.create_task(plan=plans.validate(plan), actor="bench", user=SYSTEM)
        while runner.tick():
            pass
        times = Event.objects.filter(task=task, kind__in=["step_started", "step_done"]).order_by(
            "id"
        )
        stamps = [e.created_at for e in times]
        assert len(stamps) == 2 * steps, f"{label}: {len(stamps)} events"
        out[label] = (stamps[-1] - stamps[0]).total_seconds() / steps * 1000
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--steps", type=int, default=100)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mcp-bench-") as tmp:
        setup(Path(tmp))
        calls = loop_calls(options.calls)
        floor = bare(options.calls, Path(tmp) / "bare.log")
        steps = loop_steps(options.steps)
        from loop.mcp.sessions import POOL

        POOL.close()
    print(f"MCP calls over stdio, median ms per call ({options.calls} calls each)")
    print(
        f"  bare SDK call_tool          read-only {floor['lookup']:7.2f}   side effect {floor['put']:7.2f}"
    )
    lookup, put = calls["mcp.b.lookup"], calls["mcp.b.put"]
    print(f"  loop tool run (pool, ping)  read-only {lookup:7.2f}   side effect {put:7.2f}")
    print(
        f"    the loop's own time       read-only {lookup - floor['lookup']:7.2f}   "
        f"side effect {put - floor['put']:7.2f}"
    )
    print(f"Whole tool steps through a worker on SQLite, mean ms per step ({options.steps} each)")
    print(
        f"  read-only step {steps['read-only']:7.2f}   side-effect step (outbox) "
        f"{steps['side effect']:7.2f}"
    )
    print(
        f"    the loop's own time       read-only {steps['read-only'] - floor['lookup']:7.2f}   "
        f"side effect {steps['side effect'] - floor['put']:7.2f}"
    )


if __name__ == "__main__":
    main()
