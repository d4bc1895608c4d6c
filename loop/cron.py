"""Due times of a cron expression in a time zone, by cronsim (never parsed by hand).

Due times are computed in the schedule's zone over aware datetimes and returned in UTC, so a
daylight-saving change neither repeats a slot nor skips one (cronsim follows cron: a time in
the skipped hour runs right after the change, a time in the repeated hour runs once).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

MISSED_CAP = 10_000  # counting missed slots stops here (a long outage of a minutely cron)


def zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"timezone: unknown time zone '{name}'") from None


def check(expr: str, zone_name: str) -> list[str]:
    """What is wrong with this schedule, each naming its field; [] if nothing."""
    errors = []
    try:
        tz = zone(zone_name)
    except ValueError as exc:
        errors.append(str(exc))
        tz = ZoneInfo("UTC")
    try:
        next(CronSim(expr, datetime.now(tz)))
    except CronSimError as exc:
        errors.append(f"schedule: not a cron expression '{expr}': {exc}")
    except StopIteration:
        errors.append(f"schedule: '{expr}' is never due")
    return errors


def next_after(expr: str, zone_name: str, after: datetime) -> datetime:
    """The first due time strictly after `after` (aware), in UTC."""
    return next(CronSim(expr, after.astimezone(zone(zone_name)))).astimezone(UTC)


def catch_up(
    expr: str, zone_name: str, due: datetime, now: datetime
) -> tuple[datetime, int, datetime]:
    """Given the first unfired due time `due` (<= now): the latest due time not after `now`
    (the one that fires), how many earlier ones it stands for (missed), and the next due time
    after `now`. A count that reaches MISSED_CAP stops there (the journal then says at least
    that many were missed)."""
    latest, missed = due, 0
    slots = CronSim(expr, due.astimezone(zone(zone_name)))
    for slot in slots:
        slot = slot.astimezone(UTC)
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
    for slot in CronSim(expr, (now + timedelta(seconds=1)).astimezone(zone(zone_name)), True):
        slot = slot.astimezone(UTC)
        if slot <= now:
            return max(slot, floor)
    return floor
