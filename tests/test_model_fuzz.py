"""Whatever the model endpoint answers, a real `manage.py runloop` keeps going (DESIGN.md §12
"Bounds", invariant 14): hypothesis makes the scripted server answer a model step with
arbitrary bytes, arbitrary JSON, chat completions of every shape (content, calls, ids and
names of any Unicode — NUL and lone surrogates too —, absurd usage counts), replies over the
size limit and replies with too many calls; three plain echo steps of one attempt each are
batched beside it. No tick fails, every echo step is done at its first attempt, and the model
step ends with a verdict and a paired transcript."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from django.db import transaction
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from loop import transcript
from loop.models import Event, EventKind, Step, StepState

from .conftest import make_task, model_env, start_runloop, step, wait_for
from .support.llm_server import Body, ModelServer, Raw, calls, commit, say

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.sqlite_only]
# whatever the endpoint answers: database-independent, tried on the SQLite run

REPLY_BYTES = 8192  # LOOP_LLM_MAX_REPLY_BYTES of the worker under test, so sizes are cheap
MAX_CALLS = 6
ARG_BYTES = 512

TEXT = st.text(st.characters(categories=["L", "M", "N", "P", "S", "Z", "Cc", "Cs"]), max_size=24)
COUNT = st.one_of(
    st.integers(0, 5000),
    st.integers(),
    st.floats(),
    st.sampled_from([10**30, -1, 2**31, "12", True, None]),
)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=12,
)
NAME = st.one_of(st.sampled_from(["echo", "commit_step", "add_steps", "http_post", "nope"]), TEXT)
ARGUMENTS = st.one_of(
    TEXT,
    JSON.map(json.dumps),
    JSON.map(lambda value: json.dumps({"value": value})),
    st.builds(
        lambda verdict, output: json.dumps({"verdict": verdict, "output": output}),
        st.sampled_from(["done", "failed", "retry", "blocked", "maybe"]),
        JSON,
    ),
    JSON,  # an object, not its text (some servers do)
)
CALL = st.one_of(
    st.fixed_dictionaries(
        {
            "id": st.one_of(TEXT, st.integers(), st.none()),
            "type": st.just("function"),
            "function": st.fixed_dictionaries({"name": NAME, "arguments": ARGUMENTS}),
        }
    ),
    JSON,
)
MESSAGE = st.fixed_dictionaries(
    {
        "role": st.just("assistant"),
        "content": st.one_of(st.none(), TEXT, JSON),
        "tool_calls": st.one_of(st.none(), st.lists(CALL, max_size=4), JSON),
    }
)
COMPLETION = st.fixed_dictionaries(
    {
        "choices": st.one_of(
            st.lists(
                st.fixed_dictionaries(
                    {
                        "index": st.just(0),
                        "message": st.one_of(MESSAGE, JSON),
                        "finish_reason": st.sampled_from(["stop", "length", "tool_calls", None]),
                    }
                ),
                max_size=2,
            ),
            JSON,
        ),
        "usage": st.one_of(
            st.fixed_dictionaries({"prompt_tokens": COUNT, "completion_tokens": COUNT}), JSON
        ),
    }
)
ITEM = st.one_of(
    st.builds(Raw, st.binary(max_size=300), st.sampled_from([200, 200, 400, 404, 422])),
    JSON.map(Body),
    COMPLETION.map(Body),
    COMPLETION.map(Body),
    st.integers(0, 3 * REPLY_BYTES).map(lambda n: say("x" * n)),
    st.integers(0, 3 * MAX_CALLS).map(lambda n: calls(*[("echo", {"value": i}) for i in range(n)])),
    st.integers(ARG_BYTES - 20, 2 * ARG_BYTES).map(lambda n: calls(("echo", {"value": "y" * n}))),
)

SETTLED = (StepState.DONE, StepState.FAILED, StepState.BLOCKED)
TITLE = re.compile(r"^Task: (fuzz \d+)$", re.MULTILINE)


def test_whatever_the_model_endpoint_answers_the_ticks_go_on_and_the_batch_keeps_its_verdicts(
    settings: Any, tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    queues: dict[str, list[Any]] = {}

    def script(body: dict[str, Any], n: int) -> Any:
        """The example's items in turn to its model step, then a commit."""
        briefing = next((m["content"] for m in body["messages"] if m["role"] == "user"), "")
        found = TITLE.search(briefing or "")
        queue = queues.get(found.group(1), []) if found else []
        return queue.pop(0) if queue else commit(output="fallback")

    log = tmp_path / "runloop.log"
    examples = itertools.count()
    with ModelServer(script) as model:
        settings.LOOP_LLM_BASE_URL = model.base_url  # the plans here ask for a model
        env = model_env(
            model,
            LOOP_LLM_MAX_REPLY_BYTES=str(REPLY_BYTES),
            LOOP_LLM_MAX_CALLS=str(MAX_CALLS),
            LOOP_LLM_MAX_ARG_BYTES=str(ARG_BYTES),
            LOOP_LLM_TIMEOUT_SECONDS="10",
        )
        processes.append(start_runloop(env=env, log=log))

        @hypothesis_settings(
            max_examples=40,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        )
        @given(items=st.lists(ITEM, min_size=1, max_size=3))
        def one_example(items: list[Any]) -> None:
            title = f"fuzz {next(examples)}"
            queues[title] = list(items)
            written = log.stat().st_size  # what the worker says from here on is this example's
            with transaction.atomic():  # one commit: the worker claims them in one batch
                fuzzed = make_task(
                    {"key": "m", "judge": "model", "instructions": "Do it.", "max_attempts": 1},
                    title=title,
                ).steps.get()
                plain = [
                    make_task(step(f"p{n}", max_attempts=1), title=f"{title} plain").steps.get()
                    for n in range(3)
                ]
            ids = [fuzzed.pk, *(p.pk for p in plain)]

            def settled() -> bool:
                states = dict(Step.objects.filter(pk__in=ids).values_list("pk", "state"))
                return states[fuzzed.pk] in SETTLED and all(
                    states[p.pk] == StepState.DONE for p in plain
                )

            wait_for(settled, timeout=60)
            said = log.read_bytes()[written:].decode(errors="replace")
            assert "tick failed" not in said and "write failed" not in said, said[-3000:]
            assert "Traceback" not in said, said[-3000:]
            for one in Step.objects.filter(pk__in=[p.pk for p in plain]):
                assert one.attempts == 1, one.error
            fuzzed.refresh_from_db()
            assert fuzzed.state != StepState.FAILED or fuzzed.error
            assert transcript.unpaired(transcript.entries(fuzzed)) == []
            # The plain steps were started before the model step's first verdict committed:
            # they shared its batch, so a tick it broke would have cost them their verdicts.
            verdict = (
                Event.objects.filter(step_id=fuzzed.pk)
                .filter(kind__in=[EventKind.STEP_DONE, EventKind.STEP_RETRY, EventKind.STEP_FAILED])
                .order_by("id")
                .values_list("id", flat=True)
                .first()
            ) or float("inf")
            starts = Event.objects.filter(
                step_id__in=[p.pk for p in plain], kind=EventKind.STEP_STARTED
            ).values_list("id", flat=True)
            assert all(start < verdict for start in starts)

        one_example()
    assert next(examples) >= 30  # the examples ran (hypothesis may skip a few duplicates)
