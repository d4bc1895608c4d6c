"""Schedules (DESIGN.md §10), in process with time moved by time_machine: a due time fires
once, missed slots fire once with the number journaled, a disabled schedule never fires,
daylight-saving changes neither double nor skip a slot, and a template that no longer
validates fails its run visibly, once."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import time_machine
from django.core.management import call_command
from django.core.management.base import CommandError

from loop import cron, plans, schedules
from loop.models import Event, Message, Schedule, ScheduleRun, Task
from loop.permissions import SYSTEM

from .conftest import step

BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")


def make_schedule(
    cron: str, zone: str = "UTC", *steps: dict[str, Any], title: str = "numbers"
) -> Schedule:
    plan = {"title": title, "schedule": cron, "timezone": zone, "steps": list(steps) or [step("a")]}
    return schedules.create(spec=plans.validate(plan), actor="test", user=SYSTEM)


def fired_events(kind: str = "schedule_fired") -> list[dict[str, Any]]:
    return list(Event.objects.filter(kind=kind).order_by("id").values_list("data", flat=True))


def test_a_plan_with_schedule_makes_a_schedule_and_prints_its_name(
    db: None, tmp_path: Path
) -> None:
    plan = tmp_path / "weekly.yaml"
    plan.write_text(
        "title: Weekly numbers\nschedule: '0 8 * * MON'\ntimezone: Europe/Berlin\n"
        "steps:\n  - {key: a, tool: echo, args: {value: 1}}\n"
    )
    out = io.StringIO()
    with time_machine.travel(datetime(2026, 6, 3, 12, tzinfo=UTC), tick=False):  # a Wednesday
        call_command("plan", str(plan), stdout=out)
    assert out.getvalue().strip() == "Weekly numbers"
    assert not Task.objects.exists()
    schedule = Schedule.objects.get()
    assert (schedule.cron, schedule.timezone, schedule.enabled) == (
        "0 8 * * MON",
        "Europe/Berlin",
        True,
    )
    assert schedule.next_due == datetime(2026, 6, 8, 8, tzinfo=BERLIN)  # 06:00 UTC
    assert schedule.plan == {
        "title": "Weekly numbers",
        "steps": [{"key": "a", "tool": "echo", "args": {"value": 1}}],
    }


def test_the_time_zone_defaults_to_the_sites(db: None, settings: Any) -> None:
    settings.TIME_ZONE = "America/New_York"
    spec = plans.validate({"title": "t", "schedule": "0 8 * * *", "steps": [step("a")]})
    assert spec.timezone == "America/New_York"


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"schedule": "61 * * * *"}, "schedule: not a cron expression '61 * * * *': Bad minute"),
        # cronsim reads a sixth field as seconds: `* * * * * *` fired every second.
        (
            {"schedule": "* * * * * *"},
            "schedule: '* * * * * *' has 6 fields; a schedule has five (minute, hour, day of "
            "month, month, day of week) or is one of @hourly, @daily, @weekly, @monthly, @yearly",
        ),
        (
            {"schedule": "0 8 * *"},
            "schedule: '0 8 * *' has 4 fields; a schedule has five (minute, hour, day of "
            "month, month, day of week) or is one of @hourly, @daily, @weekly, @monthly, @yearly",
        ),
        (
            {"schedule": "@reboot"},
            "schedule: '@reboot' is not one of @hourly, @daily, @weekly, @monthly, @yearly "
            "(or five cron fields)",
        ),
        ({"schedule": "0 ² * * *"}, "schedule: not a cron expression '0 ² * * *': Bad hour"),
        ({"schedule": ""}, "schedule: must be a cron expression, such as '0 8 * * MON'"),
        (
            {"schedule": "0 8 * * *", "timezone": "Mars/Olympus"},
            "timezone: unknown time zone 'Mars/Olympus'",
        ),
        ({"timezone": "UTC"}, "timezone: only with 'schedule'"),
    ],
)
def test_a_bad_schedule_is_refused_naming_the_field(
    db: None, fields: dict[str, Any], error: str
) -> None:
    with pytest.raises(plans.PlanError) as refused:
        plans.validate({"title": "t", **fields, "steps": [step("a")]})
    assert refused.value.errors == [error]


@pytest.mark.parametrize(
    ("least", "expr", "said"),
    [
        (300, "*/2 * * * *", "its minute field runs it 2 minutes apart (as at 00:02 and 00:04)"),
        (3600, "0,30 9 * * *", "its minute field runs it 30 minutes apart (as at 09:00 and 09:30)"),
        (7200, "0 8,9 * * *", "its hour field runs it 1 hour apart (as at 08:00 and 09:00)"),
        (7200, "@hourly", "its hour field runs it 1 hour apart (as at 01:00 and 02:00)"),
        (2 * 86400, "0 0 * * 5,6", "its day field runs it 1 day apart (as at 02 Jan and 03 Jan)"),
    ],
)
def test_a_schedule_that_runs_more_often_than_the_setting_allows_is_refused_naming_the_field(
    db: None, settings: Any, least: int, expr: str, said: str
) -> None:
    settings.LOOP_SCHEDULE_MIN_SECONDS = least
    with pytest.raises(plans.PlanError) as refused:
        plans.validate({"title": "t", "schedule": expr, "steps": [step("a")]})
    [error] = refused.value.errors
    assert error.startswith(f"schedule: '{expr}': {said}; a schedule runs at most every "), error
    assert error.endswith("(LOOP_SCHEDULE_MIN_SECONDS)")
    settings.LOOP_SCHEDULE_MIN_SECONDS = 60
    assert plans.validate({"title": "t", "schedule": expr, "steps": [step("a")]}).schedule == expr


@pytest.mark.parametrize(
    ("word", "first"),
    [
        ("@hourly", datetime(2026, 6, 1, 13, tzinfo=BERLIN)),
        ("@daily", datetime(2026, 6, 2, 0, tzinfo=BERLIN)),
        ("@weekly", datetime(2026, 6, 7, 0, tzinfo=BERLIN)),  # Sunday
        ("@monthly", datetime(2026, 7, 1, 0, tzinfo=BERLIN)),
        ("@yearly", datetime(2027, 1, 1, 0, tzinfo=BERLIN)),
    ],
)
def test_the_documented_words_are_schedules(db: None, word: str, first: datetime) -> None:
    with time_machine.travel(datetime(2026, 6, 1, 12, 30, tzinfo=BERLIN), tick=False):
        schedule = make_schedule(word, "Europe/Berlin")
    assert schedule.cron == word and schedule.next_due == first


def test_a_six_field_schedule_already_stored_is_switched_off_not_fired_every_second(
    db: None,
) -> None:
    schedule = make_schedule("0 8 * * *")
    Schedule.objects.filter(pk=schedule.pk).update(
        cron="* * * * * *", next_due=datetime(2026, 1, 1, tzinfo=UTC)
    )  # written before six fields were refused
    assert schedules.fire_due(actor="w1") == []
    schedule.refresh_from_db()
    assert not schedule.enabled and "has 6 fields" in schedule.last_error
    assert not ScheduleRun.objects.exists()


def test_a_second_schedule_of_the_same_name_is_refused_and_nothing_is_created(
    db: None, tmp_path: Path
) -> None:
    make_schedule("0 8 * * *", title="numbers")
    plan = tmp_path / "again.json"
    plan.write_text(json.dumps({"title": "numbers", "schedule": "0 9 * * *", "steps": [step("a")]}))
    with pytest.raises(CommandError, match="title: a schedule named 'numbers' already exists"):
        call_command("plan", str(plan), stdout=io.StringIO())
    assert Schedule.objects.get().cron == "0 8 * * *"


def test_a_due_time_fires_once_posting_its_message_with_its_task(db: None) -> None:
    with time_machine.travel(datetime(2026, 6, 1, 7, 59, tzinfo=BERLIN), tick=False) as clock:
        schedule = make_schedule("0 8 * * *", "Europe/Berlin")
        assert schedules.fire_due(actor="w1") == []
        clock.move_to(datetime(2026, 6, 1, 8, 0, 30, tzinfo=BERLIN))
        [run] = schedules.fire_due(actor="w1")
        assert schedules.fire_due(actor="w2") == []  # the slot is taken
        assert run.due_at == datetime(2026, 6, 1, 6, tzinfo=UTC) and run.missed == 0
        message = Message.objects.get()
        assert (message.author, message.author_kind, message.text) == (
            "schedule:numbers",
            "schedule",
            "[SCHEDULED TASK] numbers",
        )
        task = Task.objects.get()
        assert (task.origin, task.origin_run_id, task.origin_message_id) == (
            "schedule",
            run.pk,
            message.pk,
        )
        assert task.state == "running"
        schedule.refresh_from_db()
        assert schedule.next_due == datetime(2026, 6, 2, 6, tzinfo=UTC)
        clock.move_to(datetime(2026, 6, 2, 8, tzinfo=BERLIN))
        [second] = schedules.fire_due(actor="w2")
        assert second.due_at == datetime(2026, 6, 2, 6, tzinfo=UTC)
    assert Task.objects.count() == ScheduleRun.objects.count() == Message.objects.count() == 2
    assert [e["missed"] for e in fired_events()] == [0, 0]


def test_slots_missed_while_no_worker_ran_fire_once_and_the_journal_counts_them(db: None) -> None:
    with time_machine.travel(datetime(2026, 6, 1, 12, tzinfo=UTC), tick=False) as clock:
        schedule = make_schedule("0 8 * * *")  # first due 2 June 08:00
        clock.move_to(datetime(2026, 6, 6, 9, tzinfo=UTC))  # 2, 3, 4, 5 and 6 June have passed
        [run] = schedules.fire_due(actor="w1")
        assert schedules.fire_due(actor="w1") == []
    assert run.due_at == datetime(2026, 6, 6, 8, tzinfo=UTC) and run.missed == 4
    [fired] = fired_events()
    assert fired["missed"] == 4 and fired["due_at"] == "2026-06-06T08:00:00+00:00"
    schedule.refresh_from_db()
    assert schedule.next_due == datetime(2026, 6, 7, 8, tzinfo=UTC)
    assert Task.objects.count() == 1


def test_a_disabled_schedule_never_fires_and_on_again_does_not_catch_up(db: None) -> None:
    with time_machine.travel(datetime(2026, 6, 1, 12, tzinfo=UTC), tick=False) as clock:
        schedule = make_schedule("*/10 * * * *")
        schedules.edit(
            schedule_id=schedule.pk, changes={"enabled": False}, actor="dad", user=SYSTEM
        )
        for minutes in range(0, 24 * 60, 7):
            clock.move_to(datetime(2026, 6, 1, 12, tzinfo=UTC) + timedelta(minutes=minutes))
            assert schedules.fire_due(actor="w1") == []
        schedules.edit(schedule_id=schedule.pk, changes={"enabled": True}, actor="dad", user=SYSTEM)
        schedule.refresh_from_db()
        # The last poll was at 11:55: the next due time is after now, no catch-up.
        assert schedule.next_due == datetime(2026, 6, 2, 12, 0, tzinfo=UTC)
        clock.move_to(schedule.next_due)
        [run] = schedules.fire_due(actor="w1")
    assert run.missed == 0 and ScheduleRun.objects.count() == 1
    assert [e["fields"] for e in fired_events("schedule_edited")] == [["enabled"], ["enabled"]]


def poll(start: datetime, hours: int, every_minutes: int = 5) -> list[datetime]:
    """Fire due schedules every few minutes for `hours`; the due times that fired, in UTC."""
    with time_machine.travel(start, tick=False) as clock:
        for minutes in range(0, hours * 60 + 1, every_minutes):
            clock.move_to(start + timedelta(minutes=minutes))
            schedules.fire_due(actor="w1")
    runs = ScheduleRun.objects.order_by("due_at")
    assert all(run.missed == 0 and not run.error for run in runs)
    return [run.due_at.astimezone(UTC) for run in runs]


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)  # type: ignore[misc]


DST = {
    # Berlin, spring: 02:00 → 03:00 on 29 March. 02:30 does not exist: that day it runs at 03:00.
    "berlin-spring-0230": (
        "Europe/Berlin",
        "30 2 * * *",
        utc(2026, 3, 27, 12),
        [utc(2026, 3, 28, 1, 30), utc(2026, 3, 29, 1, 0), utc(2026, 3, 30, 0, 30)],
    ),
    # Berlin, autumn: 03:00 → 02:00 on 25 October. 02:30 happens twice: it runs once.
    "berlin-autumn-0230": (
        "Europe/Berlin",
        "30 2 * * *",
        utc(2026, 10, 23, 12),
        [utc(2026, 10, 24, 0, 30), utc(2026, 10, 25, 0, 30), utc(2026, 10, 26, 1, 30)],
    ),
    # New York, spring: 02:00 → 03:00 on 8 March.
    "new-york-spring-0230": (
        "America/New_York",
        "30 2 * * *",
        utc(2026, 3, 6, 12),
        [utc(2026, 3, 7, 7, 30), utc(2026, 3, 8, 7, 0), utc(2026, 3, 9, 6, 30)],
    ),
    # New York, autumn: 02:00 → 01:00 on 1 November. 01:30 happens twice: it runs once.
    "new-york-autumn-0130": (
        "America/New_York",
        "30 1 * * *",
        utc(2026, 10, 30, 12),
        [utc(2026, 10, 31, 5, 30), utc(2026, 11, 1, 5, 30), utc(2026, 11, 2, 6, 30)],
    ),
    # A step expression at a fixed hour runs on the clock's face too (issue 24: cronsim's
    # Debian rule ran it by the real clock, twice in October and not at all in March). Spring:
    # every slot of the skipped 02:xx folds into one run right after the change, at 03:00.
    "berlin-spring-every-15-at-2": (
        "Europe/Berlin",
        "*/15 2 * * *",
        utc(2026, 3, 28, 0, 30),
        [utc(2026, 3, 28, 1, m) for m in (0, 15, 30, 45)]
        + [utc(2026, 3, 29, 1, 0)]
        + [utc(2026, 3, 30, 0, m) for m in (0, 15, 30, 45)]
        + [utc(2026, 3, 31, 0, m) for m in (0, 15, 30)],
    ),
    # Autumn: 02:00-02:45 happen twice; each runs once, at its first occurrence (CEST).
    "berlin-autumn-every-15-at-2": (
        "Europe/Berlin",
        "*/15 2 * * *",
        utc(2026, 10, 23, 12),
        [utc(2026, 10, 24, 0, m) for m in (0, 15, 30, 45)]
        + [utc(2026, 10, 25, 0, m) for m in (0, 15, 30, 45)]
        + [utc(2026, 10, 26, 1, m) for m in (0, 15, 30, 45)],
    ),
    # A daily 08:00 keeps its local time across the change: its UTC time moves by an hour.
    "berlin-spring-0800": (
        "Europe/Berlin",
        "0 8 * * *",
        utc(2026, 3, 27, 12),
        [utc(2026, 3, 28, 7), utc(2026, 3, 29, 6), utc(2026, 3, 30, 6)],
    ),
    "new-york-autumn-0800": (
        "America/New_York",
        "0 8 * * *",
        utc(2026, 10, 30, 14),
        [utc(2026, 10, 31, 12), utc(2026, 11, 1, 13), utc(2026, 11, 2, 13)],
    ),
}


@pytest.mark.parametrize("case", DST.values(), ids=DST.keys())
def test_a_daylight_saving_change_neither_fires_a_slot_twice_nor_skips_one(
    db: None, case: tuple[str, str, datetime, list[datetime]]
) -> None:
    zone, cron, start, expected = case
    with time_machine.travel(start, tick=False):
        make_schedule(cron, zone)
    assert poll(start, hours=72) == expected


def test_every_other_hour_runs_at_two_once_when_the_clocks_go_back(db: None) -> None:
    start = utc(2026, 10, 24, 19)
    with time_machine.travel(start, tick=False):
        make_schedule("0 */2 * * *", "Europe/Berlin")
    fired = poll(start, hours=12, every_minutes=10)
    # 22:00, 00:00, 02:00 CEST, then 04:00, 06:00, 08:00 CET: not 02:00 CEST and 02:00 CET.
    assert fired == [utc(2026, 10, 24, 20), utc(2026, 10, 24, 22), utc(2026, 10, 25, 0)] + [
        utc(2026, 10, 25, h) for h in (3, 5, 7)
    ]


@pytest.mark.parametrize(
    ("zone", "start"),
    [
        ("Europe/Berlin", utc(2026, 3, 28, 12)),
        ("Europe/Berlin", utc(2026, 10, 24, 12)),
        ("America/New_York", utc(2026, 3, 7, 12)),
        ("America/New_York", utc(2026, 10, 31, 12)),
    ],
)
def test_an_hourly_schedule_fires_every_real_hour_across_a_change(
    db: None, zone: str, start: datetime
) -> None:
    with time_machine.travel(start, tick=False):
        make_schedule("0 * * * *", zone)
    fired = poll(start, hours=24, every_minutes=10)
    # Both zones change by a whole hour, so each real hour is one local hour: 24, none twice.
    assert fired == [start + timedelta(hours=h) for h in range(1, 25)]


def test_a_template_that_no_longer_validates_fails_its_run_visibly_once(
    db: None, settings: Any
) -> None:
    settings.LOOP_SHELL_ENABLED = True
    with time_machine.travel(datetime(2026, 6, 1, 12, tzinfo=UTC), tick=False) as clock:
        schedule = make_schedule(
            "0 8 * * *", "UTC", step("run", "shell.run", args={"argv": ["true"]})
        )
        settings.LOOP_SHELL_ENABLED = False  # a setting changed since
        clock.move_to(datetime(2026, 6, 2, 8, 0, 5, tzinfo=UTC))
        [run] = schedules.fire_due(actor="w1")
        for seconds in range(1, 30):  # workers poll every second: the slot is consumed
            clock.move_to(datetime(2026, 6, 2, 8, 0, 5 + seconds, tzinfo=UTC))
            assert schedules.fire_due(actor="w1") == []
        assert run.error.startswith(
            "the plan template no longer validates: step 'run': tool 'shell.run' is off"
        )
        schedule.refresh_from_db()
        assert schedule.last_error == run.error
        assert not Task.objects.exists() and not Message.objects.exists()
        [failed] = fired_events("schedule_failed")
        assert failed["error"] == run.error and failed["schedule"] == "numbers"
        settings.LOOP_SHELL_ENABLED = True  # put right: the next slot runs
        clock.move_to(datetime(2026, 6, 3, 8, tzinfo=UTC))
        [ok] = schedules.fire_due(actor="w1")
    assert not ok.error and Task.objects.count() == 1
    schedule.refresh_from_db()
    assert schedule.last_error == ""


def test_a_long_outage_of_a_minutely_schedule_fires_once_counting_up_to_the_cap(db: None) -> None:
    start = datetime(2026, 6, 1, tzinfo=UTC)
    with time_machine.travel(start, tick=False) as clock:
        schedule = make_schedule("* * * * *", "Europe/Berlin")
        clock.move_to(start + timedelta(days=30))  # 43,200 slots; now is exactly on one
        [run] = schedules.fire_due(actor="w1")
        assert schedules.fire_due(actor="w1") == []
    assert run.due_at == start + timedelta(days=30) and run.missed == cron.MISSED_CAP
    schedule.refresh_from_db()
    assert schedule.next_due == start + timedelta(days=30, minutes=1)


def test_a_cron_that_no_longer_reads_switches_the_schedule_off_visibly(db: None) -> None:
    schedule = make_schedule("0 8 * * *")
    Schedule.objects.filter(pk=schedule.pk).update(
        cron="0 8 * * NOPE", next_due=datetime(2026, 1, 1, tzinfo=UTC)
    )  # changed behind the admin's back
    assert schedules.fire_due(actor="w1") == []
    schedule.refresh_from_db()
    assert not schedule.enabled and schedule.last_error.startswith("switched off: its cron")
    assert schedules.fire_due(actor="w1") == []
    assert [e["error"] for e in fired_events("schedule_failed")] == [schedule.last_error]
