"""Model judge overhead: the loop's own time per model turn and per tool call, against the
scripted OpenAI-compatible server of the tests (tests/llm_server.py), the server's time
excluded.

    .venv/bin/python bench/model_overhead.py [--tasks 20] [--turns 5] [--calls 2]

On a fresh SQLite file, an in-process worker runs `--tasks` model steps; the model answers
each of `--turns` turns with `--calls` read-only `echo` calls, then `commit_step`. Every reply
is committed before its calls run and every result before the next request (the durable
transcript), so a turn costs one request and two commits: the reply, then its calls' results
together. Loop time = wall time of the run minus the server's time answering (measured inside
the server, from the request's first line read to the answer written): the openai client, the transcript writes, the tools, the step's start and
verdict. Split in two: a tool call's own time (checking the call, running the tool, its
result's commit: `Tick.answer`, and `Tick._flush` for read-only calls' results, which one
commit writes together) per tool call, and the rest per turn (the request built and
sent, the reply parsed and committed, the step's start and verdict shared by its turns).
Before them, the whole loop time divided by turns and by tool calls, as earlier versions
printed it. The machine's load too (figures on a shared machine are noisy).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def setup_django(folder: Path) -> None:
    os.environ["PIPPA_DATA_DIR"] = str(folder)
    os.environ["DATABASE_URL"] = f"sqlite:///{folder / 'loop.sqlite3'}"
    os.environ["DJANGO_SETTINGS_MODULE"] = "pippa_site.settings"
    os.environ.setdefault("LOOP_LOG_LEVEL", "WARNING")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def timing(*names: tuple[Any, str]) -> list[float]:
    """Each `owner.name` made to add the seconds its calls take to the list returned; a call
    of one inside another is counted once."""
    spent = [0.0]
    depth = [0]

    def timer(func: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            depth[0] += 1
            began = time.perf_counter()
            try:
                return func(*args, **kwargs)
            finally:
                depth[0] -= 1
                if not depth[0]:
                    spent[0] += time.perf_counter() - began

        return timed

    for owner, name in names:
        setattr(owner, name, timer(getattr(owner, name)))
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=20)
    parser.add_argument("--turns", type=int, default=5, help="turns with calls before the commit")
    parser.add_argument("--calls", type=int, default=2, help="echo calls per turn")
    parser.add_argument("--dir", type=Path, default=ROOT / "var")
    options = parser.parse_args()
    options.dir.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="bench-model-", dir=options.dir))
    try:
        setup_django(folder)
        from django.conf import settings

        from loop import actions, llm, plans
        from loop.judges import model as model_judge
        from loop.models import Step, StepState, TranscriptEntry
        from loop.permissions import SYSTEM
        from loop.worker import Worker
        from tests.support.llm_server import ModelServer, calls, commit

        def script(body: dict[str, Any], n: int) -> Any:
            said = sum(1 for m in body["messages"] if m["role"] == "assistant")
            if said < options.turns:
                return calls(*[("echo", {"value": [said, c]}) for c in range(options.calls)])
            return commit(output=said)

        in_client = timing((llm, "complete"))  # the openai client, and the server's answer
        # A tool call, and its result's commit (read-only calls' results commit together).
        in_calls = timing((model_judge.Tick, "answer"), (model_judge.Tick, "_flush"))
        with ModelServer(script) as model:
            settings.LOOP_LLM_BASE_URL = model.base_url
            settings.LOOP_LLM_MAX_TURNS = options.turns + 2
            spec = plans.validate(
                {
                    "title": "bench",
                    "steps": [{"key": "s", "judge": "model", "instructions": "Echo, then commit."}],
                }
            )
            runner = Worker(label="bench")
            runner.boot()
            # Warm up: the openai package's import and the first connection are not counted.
            actions.create_task(plan=spec, actor="bench", user=SYSTEM)
            while runner.tick():
                pass
            served_before, asked_before = model.server_seconds, len(model.requests)
            in_client[0] = in_calls[0] = 0.0
            calls_before = TranscriptEntry.objects.filter(role="tool").count()
            for _ in range(options.tasks):
                actions.create_task(plan=spec, actor="bench", user=SYSTEM)
            began = time.perf_counter()
            while runner.tick():
                pass
            wall = time.perf_counter() - began
            served = model.server_seconds - served_before
            turns = len(model.requests) - asked_before
            tool_calls = TranscriptEntry.objects.filter(role="tool").count() - calls_before
            assert not Step.objects.exclude(state=StepState.DONE).exists()
        loop = wall - served
        print(f"load average: {os.getloadavg()}")
        print(
            f"{options.tasks} model steps, {turns} model turns, {tool_calls} tool calls "
            f"(commit_step included) in {wall:.2f} s; the server answered for {served:.2f} s"
        )
        print(f"loop time, all of it, per turn: {1000 * loop / turns:.2f} ms")
        print(f"loop time, all of it, per tool call: {1000 * loop / tool_calls:.2f} ms")
        calls_ms = 1000 * in_calls[0] / tool_calls
        turn_ms = 1000 * (loop - in_calls[0]) / turns
        print(f"a tool call's own time: {calls_ms:.2f} ms (target < 2)")
        print(f"a turn's own time, its tool calls aside: {turn_ms:.2f} ms (target < 5)")
        client = in_client[0] - served
        print(
            f"of which the openai client (request out, reply parsed): {1000 * client / turns:.2f} ms"
            f" per turn; the rest (transcript commits, tools, starts and verdicts): "
            f"{1000 * (loop - client) / turns:.2f} ms per turn"
        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
