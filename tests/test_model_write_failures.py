"""A transcript write that fails (DESIGN.md §11, §12), at each write of a model step's tick in
turn: the error is visible (the tick raises, naming task and step), and once writes work the
step finishes with its transcript paired and nothing delivered twice."""

from __future__ import annotations

import logging
import os
import re
from typing import Any

import pytest
import time_machine
from django.db import DatabaseError
from django.utils import timezone

from loop import transcript
from loop.models import Effect, Step, StepState, Task
from loop.worker import Worker

from .conftest import make_task, process_env
from .support.chaos_sinks import HttpSink
from .support.llm_server import ModelServer, calls, commit, tool_results
from .support.truth import Person
from .test_write_failures import Faults, time_passes


def model_post_task(web: HttpSink, title: str) -> Task:
    return make_task(
        {
            "key": "send",
            "judge": "model",
            "instructions": "Look, then post the report.",
            "tools": ["echo", "http.post"],
            "side_effect": True,
            "max_attempts": 50,
        },
        title=title,
    )


def run_out(runner: Worker, person: Person) -> None:
    for _ in range(20):
        while runner.tick():
            pass
        if not person.answer_questions():
            return
    raise AssertionError("the run did not settle")


def test_a_transcript_write_failing_at_each_position_is_visible_and_sends_nothing_twice(
    transactional_db: None, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    settings.LOOP_MIN_FREE_MB = 0
    settings.LOOP_RETRY_BASE_SECONDS = 0
    settings.LOOP_LLM_RETRY_SECONDS = 3
    with HttpSink(db_path=process_env()["DATABASE_URL"]) as web:
        hook = web.url("/hook/other")  # can't be probed: a cut POST is asked about

        def script(body: dict[str, Any], n: int) -> Any:
            if not tool_results(body["messages"]):
                return calls(
                    ("echo", {"value": "looked"}), ("http_post", {"url": hook, "json": {"r": 1}})
                )
            return commit(output={"posted": True})

        with ModelServer(script) as model, time_machine.travel(timezone.now(), tick=True) as clock:
            settings.LOOP_LLM_BASE_URL = model.base_url
            person = Person(web=web)
            runner = Worker(label="faulty")
            runner.boot()
            first = model_post_task(web, "clean")
            with Faults().injected() as clean:  # the writes of this step's life, counted
                while not Step.objects.filter(task=first, state=StepState.DONE).exists():
                    assert runner.tick()
            assert clean.count > 0
            failures = []
            only = os.environ.get("MODEL_FAULT_AT")
            for k in [int(only)] if only else range(1, clean.count + 1):
                task = model_post_task(web, f"write {k} fails")
                caplog.clear()
                with Faults(fail_at=k).injected() as faults, pytest.raises(DatabaseError):
                    while runner.tick():
                        pass
                assert faults.failed, f"write {k} of {clean.count} was never reached"
                failures.append(faults.failed)
                errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
                claiming = re.search(r'"?lease_epoch"? = "?lease_epoch"? \+ 1', faults.statement)
                named = "claiming a task" if claiming else f"task {task.pk} step 'send'"
                assert any(named in m and "injected" in m for m in errors), (faults.failed, errors)
                assert not web.record.violations  # nothing sent without a committed intent

                time_passes(clock, settings.LOOP_LEASE_SECONDS + 1)
                run_out(runner, person)
                step = Step.objects.get(task=task)
                assert step.state == StepState.DONE, (faults.failed, step.state, step.error)
                assert transcript.unpaired(transcript.entries(step)) == [], faults.failed
    print(f"\nfailed each of {clean.count} writes in turn: {failures}")
    counts = web.record.counts()
    assert sorted(counts) == sorted(Effect.objects.values_list("pk", flat=True))
    assert set(counts.values()) == {1}
    assert not Step.objects.exclude(state=StepState.DONE).exists()
