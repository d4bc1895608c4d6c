"""Invariant 12 (DESIGN.md §15): a schedule's due time fires once, whatever the number of
workers. Three real `runloop` processes poll the same schedules at once.

A child's clock can't be moved, so the schedules are made due by their stored next due time:
each was last due ten minutes ago (ten slots of a minutely cron missed). The workers fire each
schedule's latest slot once; if the test crosses a minute boundary, that new slot fires once
too. Nothing else may fire, and no slot twice."""

from __future__ import annotations

import subprocess
from collections import Counter
from datetime import UTC, timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from loop import plans, schedules
from loop.models import Event, Message, Schedule, ScheduleRun, Task, Worker
from loop.permissions import SYSTEM

from .conftest import start_runloop, step, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SCHEDULES = 90


def minutely(name: str, *, enabled: bool = True) -> Schedule:
    plan = {"title": name, "schedule": "* * * * *", "steps": [step("a")]}
    schedule = schedules.create(spec=plans.validate(plan), actor="dad", user=SYSTEM)
    # Not due before every worker polls: the slots become due all at once, below.
    Schedule.objects.filter(pk=schedule.pk).update(
        next_due=timezone.now() + timedelta(days=1), enabled=enabled
    )
    return schedule


def test_three_workers_fire_each_due_slot_once(
    tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    due = [minutely(f"s{n}") for n in range(SCHEDULES)]
    off = minutely("off", enabled=False)
    began = timezone.now()
    for n in range(3):
        processes.append(start_runloop("--worker-id", f"w{n}", log=tmp_path / f"w{n}.out"))
    wait_for(lambda: Worker.objects.count() == 3, timeout=60)
    ten_ago = (timezone.now() - timedelta(minutes=10)).replace(second=0, microsecond=0)
    Schedule.objects.update(next_due=ten_ago)  # every worker sees them due at its next poll
    wait_for(
        lambda: ScheduleRun.objects.values("schedule").distinct().count() == SCHEDULES, timeout=60
    )
    wait_for(lambda: not Task.objects.open().exists(), timeout=60)
    for proc in processes:
        proc.terminate()
    for proc in processes:
        assert proc.wait(timeout=30) == 0
    ended = timezone.now()

    runs = list(ScheduleRun.objects.order_by("schedule_id", "due_at"))
    assert not ScheduleRun.objects.filter(schedule=off).exists()
    # Each slot fired once: the first run is the latest slot when the workers began (the ten
    # before it counted as missed), then one run per minute boundary crossed, none twice.
    minutes_crossed = int(ended.replace(second=0, microsecond=0).timestamp() // 60) - int(
        began.replace(second=0, microsecond=0).timestamp() // 60
    )
    for schedule in due:
        mine = [r for r in runs if r.schedule_id == schedule.pk]
        assert 1 <= len(mine) <= 1 + minutes_crossed, mine
        first = mine[0]
        assert first.missed >= 10 and first.due_at <= first.fired_at
        assert first.due_at.astimezone(UTC).second == 0
        assert all(
            b.due_at - a.due_at == timedelta(minutes=1)
            for a, b in zip(mine, mine[1:], strict=False)
        )
        assert all(r.missed == 0 for r in mine[1:])
    fired_by = Counter(r.fired_by for r in runs)
    # One task and one message per run, in the same transaction as the run.
    assert Task.objects.count() == Message.objects.count() == len(runs)
    assert sorted(Task.objects.values_list("origin_run", flat=True)) == sorted(r.pk for r in runs)
    assert all(t.state == "done" for t in Task.objects.all())
    fired = Event.objects.filter(kind="schedule_fired")
    assert fired.count() == len(runs)
    # The journal names each run with the slots it stood for.
    assert sorted((e.data["run"], e.data["missed"]) for e in fired) == [
        (r.pk, r.missed) for r in sorted(runs, key=lambda r: r.pk)
    ]
    print(f"runs {len(runs)} over {minutes_crossed} minute boundaries; fired by {dict(fired_by)}")
