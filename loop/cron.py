"""Due times of a cron expression in a time zone, by cronsim (never parsed by hand).

An expression is five fields (minute, hour, day of month, month, day of week), or one of the
words @hourly, @daily, @weekly, @monthly, @yearly. cronsim would also take a sixth field of
seconds (`* * * * * *` fired every second): refused, as is any schedule that would fire more
often than LOOP_SCHEDULE_MIN_SECONDS, naming the field that makes it so.

Due times are computed in the schedule's zone and returned in UTC. A daylight-saving change
neither repeats a slot nor skips one:

- An expression whose hour field is `*` runs by the real clock: `*/15 * * * *` every fifteen
  real minutes, `0 * * * *` every real hour, across a change as on any other day.
- Any other runs on the clock's face, as cron does for a job at a fixed time: a time in the
  hour the clocks skip runs right after the change (every slot of that hour folded into one
  run, at 03:00 in Europe/Berlin), a time in the hour they repeat runs once, at its first
  occurrence. cronsim does so only when neither the minute nor the hour field starts with `*`
  (Debian cron's rule, under which `*/15 2 * * *` fired 02:15-02:45 twice in October and not at
  all in March); so a leading `*` of those fields is written out as its whole range
  (`*/15` as `0-59/15`), which means the same times and takes cronsim's clock-face rule.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError
from django.conf import settings

MISSED_CAP = 10_000  # counting missed slots stops here (a long outage of a minutely cron)
WORDS = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@yearly": "0 0 1 1 *",
}
FIELDS = ("minute", "hour", "day of month", "month", "day of week")
RANGES = {"minute": "0-59", "hour": "0-23"}
# How far ahead the check for the shortest time between two runs looks.
LOOK_RUNS = 2000
LOOK_SPAN = timedelta(days=400)
LOOK_FROM = datetime(2026, 1, 1, tzinfo=UTC)


def zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"timezone: unknown time zone '{name}'") from None


def expanded(expr: str) -> str:
    """The five fields cronsim is given for `expr` (see the module's docstring); ValueError
    naming the schedule unless it is five fields or one of WORDS."""
    text = expr.strip()
    if text.startswith("@"):
        if text not in WORDS:
            raise ValueError(
                f"schedule: '{text}' is not one of {', '.join(WORDS)} (or five cron fields)"
            )
        text = WORDS[text]
    fields = text.split()
    if len(fields) != len(FIELDS):
        raise ValueError(
            f"schedule: '{expr}' has {len(fields)} field{'s' * (len(fields) != 1)}; a schedule "
            "has five (minute, hour, day of month, month, day of week) or is one of "
            + ", ".join(WORDS)
        )
    if fields[1] != "*":  # on the clock's face: a leading '*' of minute or hour spelled out
        for index in (0, 1):
            fields[index] = ",".join(
                RANGES[FIELDS[index]] + term[1:] if term.startswith("*") else term
                for term in fields[index].split(",")
            )
    return " ".join(fields)


def check(expr: str, zone_name: str) -> list[str]:
    """What is wrong with this schedule, each naming its field; [] if nothing."""
    errors = []
    try:
        tz = zone(zone_name)
    except ValueError as exc:
        errors.append(str(exc))
        tz = ZoneInfo("UTC")
    try:
        five = expanded(expr)
        next(CronSim(five, datetime.now(tz)))
    except ValueError as exc:
        errors.append(str(exc))
        return errors
    except CronSimError as exc:  # "Bad minute": it names the field
        errors.append(f"schedule: not a cron expression '{expr}': {exc}")
        return errors
    except StopIteration:
        errors.append(f"schedule: '{expr}' is never due")
        return errors
    too_often = _too_often(expr, five, int(settings.LOOP_SCHEDULE_MIN_SECONDS))
    if too_often:
        errors.append(too_often)
    return errors


def _too_often(expr: str, five: str, least: int) -> str | None:
    """Why `expr` would run more often than every `least` seconds (naming the field whose
    values are closer than that), or None. Five fields run at most once a minute; beyond that
    the shortest time between two runs is found by walking its runs (by the clock's face, in
    UTC) over LOOK_RUNS runs or LOOK_SPAN, whichever ends first."""
    if least <= 60:
        return None
    slots = CronSim(five, LOOK_FROM)
    try:
        previous = next(slots)
        for _ in range(LOOK_RUNS):
            slot = next(slots)
            gap = (slot - previous).total_seconds()
            if gap < least:
                field = "minute" if gap < 3600 else "hour" if gap < 86400 else "day"
                shown = "%H:%M" if gap < 86400 else "%d %b"
                return (
                    f"schedule: '{expr}': its {field} field runs it {_span(gap)} apart "
                    f"(as at {previous:{shown}} and {slot:{shown}}); a schedule runs at most "
                    f"every {_span(least)} (LOOP_SCHEDULE_MIN_SECONDS)"
                )
            if slot - LOOK_FROM > LOOK_SPAN:
                break
            previous = slot
    except StopIteration:
        pass
    return None


def _span(seconds: float) -> str:
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            count = int(seconds // size)
            return f"{count} {unit}{'s' * (count != 1)}"
    return f"{int(seconds)} seconds"


def next_after(expr: str, zone_name: str, after: datetime) -> datetime:
    """The first due time strictly after `after` (aware), in UTC."""
    for slot in CronSim(expanded(expr), after.astimezone(zone(zone_name))):
        slot = slot.astimezone(UTC)
        if slot > after:  # a folded slot (the skipped hour) may land on or before `after`
            return slot
    raise StopIteration  # pragma: no cover - cronsim ends its own iteration first


def catch_up(
    expr: str, zone_name: str, due: datetime, now: datetime
) -> tuple[datetime, int, datetime]:
    """Given the first unfired due time `due` (<= now): the latest due time not after `now`
    (the one that fires), how many earlier ones it stands for (missed), and the next due time
    after `now`. A count that reaches MISSED_CAP stops there (the journal then says at least
    that many were missed)."""
    latest, missed = due, 0
    slots = CronSim(expanded(expr), due.astimezone(zone(zone_name)))
    for slot in slots:
        slot = slot.astimezone(UTC)
        if slot <= latest:
            continue  # the skipped hour's slots fold into one run: it counts once
        if slot > now:
            return latest, missed, slot
        latest, missed = slot, missed + 1
        if missed >= MISSED_CAP:
            break
    # Too many to count: fire the last slot before now, and go on from there.
    latest = _last_not_after(expr, zone_name, now, latest)
    return latest, missed, next_after(expr, zone_name, now)


def _last_not_after(expr: str, zone_name: str, now: datetime, floor: datetime) -> datetime:
    # cronsim's reverse walk yields times strictly before its start: start just after now.
    start = (now + timedelta(seconds=1)).astimezone(zone(zone_name))
    for slot in CronSim(expanded(expr), start, True):
        slot = slot.astimezone(UTC)
        if slot <= now:
            return max(slot, floor)
    return floor


SHORT_DAYS = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"]
DAYS = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]


def in_words(expr: str, zone_name: str) -> str:
    """The schedule as a person says it: "every day at 07:00, Europe/Berlin"; the cron fields
    themselves when they say something rarer."""
    return f"{_words(expr)}, {zone_name}"


def _words(expr: str) -> str:
    text = expr.strip()
    fields = WORDS.get(text, text).split()
    if len(fields) != 5:
        return f"cron {text}"
    minute, hour, day, month, weekday = fields
    plain = minute.isdigit() and hour.isdigit()
    at = f"{int(hour):02d}:{int(minute):02d}" if plain else ""
    if (day, month) == ("*", "*"):
        if (minute, hour, weekday) == ("*", "*", "*"):
            return "every minute"
        if minute.startswith("*/") and (hour, weekday) == ("*", "*") and minute[2:].isdigit():
            return f"every {int(minute[2:])} minutes"
        if minute.isdigit() and (hour, weekday) == ("*", "*"):
            return "every hour" + (f" at {int(minute)} past" if int(minute) else ", on the hour")
        if plain and weekday == "*":
            return f"every day at {at}"
        if plain and weekday == "1-5":
            return f"every weekday at {at}"
        named = SHORT_DAYS.index(weekday.upper()) if weekday.upper() in SHORT_DAYS else None
        if weekday.isdigit() and int(weekday) < len(DAYS):
            named = int(weekday)
        if plain and named is not None:
            return f"every {DAYS[named]} at {at}"
    if plain and day.isdigit() and (month, weekday) == ("*", "*"):
        return f"on day {int(day)} of every month at {at}"
    return f"cron {text}"


def next_runs(expr: str, zone_name: str, after: datetime, count: int = 3) -> list[datetime]:
    """The next `count` due times after `after` (UTC)."""
    found: list[datetime] = []
    for _ in range(count):
        after = next_after(expr, zone_name, after)
        found.append(after)
    return found
