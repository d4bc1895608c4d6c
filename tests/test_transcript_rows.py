"""A model step's tick holds its transcript in memory and numbers its writes after it
(`transcript.add_*` with `rows`): nothing is read back each turn. If another writer added an
entry meanwhile (a holder whose lease moved on), the unique (step, seq) refuses the write and
the transcript is read again: the entry lands after the other, and a result for a call that
has one already is refused (`Orphan`) as without the held rows."""

from __future__ import annotations

from typing import Any

import pytest

from loop import transcript
from loop.models import Step, TranscriptEntry

from .conftest import make_task

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _model(settings: Any) -> None:
    settings.LOOP_LLM_BASE_URL = "http://127.0.0.1:9/v1"  # a model step is planned, never run


def _step() -> Step:
    task = make_task({"key": "think", "judge": "model", "instructions": "Think."})
    return Step.objects.get(task=task)


def test_writes_with_held_rows_append_to_them_and_read_nothing(
    django_assert_num_queries: object,
) -> None:
    step = _step()
    rows = transcript.entries(step)
    transcript.add(step, "system", "be good", rows=rows)
    calls = [{"id": "a", "name": "echo", "arguments": "{}"}]
    reply = transcript.add_reply(step, "", calls, rows=rows)
    assert [r.seq for r in rows] == [0, 1] and rows[-1] is reply
    with django_assert_num_queries(4) as done:  # type: ignore[operator]
        # BEGIN, the entry, its journal event, COMMIT: no read
        transcript.add_result(step, "a", "done", rows=rows)
    assert not any(q["sql"].startswith("SELECT") for q in done.captured_queries)
    assert [r.seq for r in rows] == [0, 1, 2]
    assert list(TranscriptEntry.objects.filter(step=step).values_list("seq", "role")) == [
        (0, "system"),
        (1, "assistant"),
        (2, "tool"),
    ]


def test_an_entry_written_meanwhile_is_read_and_numbered_after() -> None:
    step = _step()
    rows = transcript.entries(step)
    transcript.add(step, "system", "be good", rows=rows)
    calls = [{"id": "a", "name": "echo", "arguments": "{}"}, {"id": "b", "name": "echo"}]
    transcript.add_reply(step, "", calls, rows=rows)
    stale = list(rows)
    transcript.add_result(step, "a", "by the new holder")  # another writer: no held rows
    entry = transcript.add_result(step, "b", "by the old holder", rows=stale)
    assert entry.seq == 3
    assert [r.seq for r in stale] == [0, 1, 2, 3]  # read again, then appended
    with pytest.raises(transcript.Orphan, match="has its result already"):
        transcript.add_result(step, "a", "twice", rows=list(rows))
    assert TranscriptEntry.objects.filter(step=step, tool_call_id="a").count() == 1
