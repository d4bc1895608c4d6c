"""A property (DESIGN.md §12, the durable transcript): for scripted model turns cut at any
write, the transcript rebuilt after recovery is paired — every call has exactly one result,
every result answers a call — and no side-effect call is delivered twice."""

from __future__ import annotations

from typing import Any

import pytest
import time_machine
from django.db import DatabaseError
from django.utils import timezone
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from loop import transcript
from loop.models import Effect, Step, StepState
from loop.worker import Worker

from .conftest import make_task, process_env
from .support.chaos_sinks import HttpSink
from .support.llm_server import ModelServer, calls, commit
from .support.truth import Person
from .test_write_failures import Faults, time_passes

KINDS = ("echo", "post", "bogus", "bad_args")
turns_strategy = st.lists(st.lists(st.sampled_from(KINDS), min_size=1, max_size=3), max_size=3)


@pytest.fixture(scope="module")
def web() -> Any:
    with HttpSink(db_path=process_env()["DATABASE_URL"]) as sink:
        yield sink


def reply(kinds: list[str], turn: int, hook: str) -> dict[str, Any]:
    made: list[tuple[str, dict[str, Any] | str]] = []
    for n, kind in enumerate(kinds):
        if kind == "echo":
            made.append(("echo", {"value": [turn, n]}))
        elif kind == "post":
            made.append(("http_post", {"url": hook, "json": {"turn": turn, "call": n}}))
        elif kind == "bogus":
            made.append(("teleport", {}))
        else:
            made.append(("echo", "{broken"))
    return calls(*made)


@hypothesis_settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(turns=turns_strategy, cut=st.integers(1, 60))
def test_turns_cut_at_any_write_leave_a_paired_transcript_and_no_call_sent_twice(
    transactional_db: None, settings: Any, web: HttpSink, turns: list[list[str]], cut: int
) -> None:
    settings.LOOP_MIN_FREE_MB = 0
    settings.LOOP_RETRY_BASE_SECONDS = 0
    settings.LOOP_LLM_RETRY_SECONDS = 2
    hook = web.url("/hook/other")

    def script(body: dict[str, Any], n: int) -> Any:
        said = sum(1 for m in body["messages"] if m["role"] == "assistant")
        return reply(turns[said], said, hook) if said < len(turns) else commit(output=said)

    with ModelServer(script) as model, time_machine.travel(timezone.now(), tick=True) as clock:
        settings.LOOP_LLM_BASE_URL = model.base_url
        runner = Worker(label="cut")
        runner.boot()
        task = make_task(
            {
                "key": "work",
                "judge": "model",
                "instructions": "Do the scripted work.",
                "tools": ["echo", "http.post"],
                "side_effect": True,
                "max_attempts": 50,
            }
        )
        step = Step.objects.get(task=task)
        try:
            with Faults(fail_at=cut).injected():
                while runner.tick():
                    pass
        except DatabaseError:
            pass  # the cut: nothing after it was written
        time_passes(clock, settings.LOOP_LEASE_SECONDS + 1)
        person = Person(web=web)
        for _ in range(20):
            while runner.tick():
                pass
            if not person.answer_questions():
                break
        step.refresh_from_db()
        assert step.state == StepState.DONE, (step.state, step.error)
        rows = transcript.entries(step)
        assert transcript.unpaired(rows) == []
        assert transcript.dangling(rows) == []
        counts = web.record.counts()
        mine = list(Effect.objects.filter(step=step).values_list("pk", flat=True))
        assert all(counts[pk] == 1 for pk in mine), {pk: counts[pk] for pk in mine}
        posts = sum(kinds.count("post") for kinds in turns)
        assert len(mine) == posts  # every post call was sent, each once
