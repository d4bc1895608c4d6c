"""Schedules (DESIGN.md §10): created from a plan with `schedule`, fired by the workers.

A due slot fires exactly once however many workers poll: the firing transaction moves the
schedule's `next_due` with a compare-and-set (only the worker whose UPDATE matched the
`next_due` it read goes on) and inserts the run's (schedule, due_at) row, which is unique.
In that same transaction the run posts `[SCHEDULED TASK] <name>` and creates its task.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from cronsim import CronSimError
from django.db import IntegrityError, transaction
from django.utils import timezone

from . import actions, conversation, cron, journal, plans
from .models import AuthorKind, EventKind, Origin, Schedule, ScheduleRun
from .permissions import SYSTEM, Who, require

log = logging.getLogger("loop.schedules")

POLL_SECONDS = 1.0  # how often a worker looks for due schedules
FIRE_LIMIT = 50  # due schedules one poll fires at most; the next poll takes the rest
EDITABLE = ("name", "cron", "timezone", "plan", "enabled")


def create(*, spec: plans.PlanSpec, actor: str, user: Who, name: str | None = None) -> Schedule:
    """A schedule from a validated plan with `schedule`; named `name`, by default the plan's
    title. Its first due time is the first one after now."""
    require(user, "create a schedule", actor=actor)
    name = name or spec.title
    if spec.schedule is None or spec.timezone is None or spec.template is None:
        raise actions.Refused("schedule: this plan has no schedule")
    with transaction.atomic():
        if Schedule.objects.filter(name=name).exists():
            field = "title" if name == spec.title else "name"
            raise actions.Refused(f"{field}: a schedule named '{name}' already exists")
        schedule = Schedule.objects.create(
            name=name,
            cron=spec.schedule,
            timezone=spec.timezone,
            plan=spec.template,
            next_due=cron.next_after(spec.schedule, spec.timezone, timezone.now()),
            created_by=actor,
        )
        journal.record(EventKind.SCHEDULE_CREATED, actor=actor, **_named(schedule))
    return schedule


def edit(*, schedule_id: int, changes: dict[str, Any], actor: str, user: Who) -> Schedule:
    """Change a schedule's name, cron, time zone, plan template or on/off switch. A new cron
    or zone, or switching it on, sets the next due time from now: slots that passed while it
    was off never fire. Needs what making one needs (its runs answer in advance)."""
    require(user, "edit a schedule", actor=actor)
    unknown = sorted(set(changes) - set(EDITABLE))
    if unknown:
        raise actions.Refused(f"{unknown[0]}: not a field of a schedule")
    with transaction.atomic():
        schedule = Schedule.objects.select_for_update().get(pk=schedule_id)
        before = {name: getattr(schedule, name) for name in EDITABLE}
        for name, value in changes.items():
            setattr(schedule, name, value)
        errors = validate(schedule)
        if errors:
            raise plans.PlanError(errors)
        changed = sorted(n for n in EDITABLE if getattr(schedule, n) != before[n])
        if not changed:
            return schedule
        timing = {"cron", "timezone"} & set(changed) or (schedule.enabled and not before["enabled"])
        if timing:
            schedule.next_due = cron.next_after(schedule.cron, schedule.timezone, timezone.now())
        try:
            with transaction.atomic():
                schedule.save(update_fields=[*changed, *(["next_due"] if timing else [])])
        except IntegrityError:
            raise actions.Refused(f"name: a schedule named '{schedule.name}' exists") from None
        journal.record(EventKind.SCHEDULE_EDITED, actor=actor, fields=changed, **_named(schedule))
    return schedule


def validate(schedule: Schedule) -> list[str]:
    """What is wrong with a schedule's fields (the admin's form shows these)."""
    errors = []
    if not isinstance(schedule.name, str) or not schedule.name.strip():
        errors.append("name: required")
    errors += cron.check(schedule.cron, schedule.timezone)
    try:
        spec = plans.validate(schedule.plan)
    except plans.PlanError as exc:
        errors += [f"plan: {e}" for e in exc.errors]
    else:
        if spec.schedule is not None:
            errors.append("plan: the template has no 'schedule' of its own")
    return errors


def fire_due(*, actor: str, now: datetime | None = None) -> list[ScheduleRun]:
    """Fire every enabled schedule due at `now`, each in its own transaction. The runs this
    caller fired (another worker's wins are not among them)."""
    now = now or timezone.now()
    due = Schedule.objects.filter(enabled=True, next_due__lte=now).order_by("next_due")
    fired = []
    for schedule_id in list(due.values_list("pk", flat=True)[:FIRE_LIMIT]):
        run = fire(schedule_id=schedule_id, actor=actor, now=now)
        if run is not None:
            fired.append(run)
    return fired


def fire(*, schedule_id: int, actor: str, now: datetime) -> ScheduleRun | None:
    """Claim the schedule's due slot and fire it: one transaction. Slots missed before it fire
    as this one run (the number is journaled). A template that no longer validates fails the
    run visibly and consumes the slot; the next slot tries again. None if it was not due, or
    another worker claimed it first."""
    with transaction.atomic():
        schedule = Schedule.objects.filter(pk=schedule_id, enabled=True, next_due__lte=now).first()
        if schedule is None:
            return None
        try:
            due_at, missed, next_due = cron.catch_up(
                schedule.cron, schedule.timezone, schedule.next_due, now
            )
        except (CronSimError, ValueError) as exc:
            # Only a row changed behind the admin's back gets here: without due times it
            # can't fire, so it is switched off, visibly, rather than failing every second.
            error = f"switched off: its cron or time zone no longer reads: {exc}"
            Schedule.objects.filter(pk=schedule.pk).update(enabled=False, last_error=error)
            journal.record(EventKind.SCHEDULE_FAILED, actor=actor, error=error, **_named(schedule))
            log.error("%s: %s", schedule, error)
            return None
        claimed = Schedule.objects.filter(
            pk=schedule.pk, enabled=True, next_due=schedule.next_due
        ).update(next_due=next_due, last_run_at=now)
        if claimed != 1:
            return None  # another worker moved it on first
        try:
            with transaction.atomic():
                run = ScheduleRun.objects.create(
                    schedule=schedule, due_at=due_at, missed=missed, fired_by=actor
                )
        except IntegrityError:
            log.warning("%s: slot %s had already fired", schedule, due_at.isoformat())
            return None
        return _start(schedule, run, actor=actor)


def run_now(*, schedule_id: int, actor: str, user: Who) -> ScheduleRun:
    """Dad's "Run now": one run of the schedule at this moment, off or on, its next due time
    unchanged; its task as any run's (the schedule's template, its standing authorization).
    Needs what editing a schedule needs."""
    require(user, "edit a schedule", actor=actor)
    with transaction.atomic():
        schedule = Schedule.objects.select_for_update().get(pk=schedule_id)
        now = timezone.now()
        if ScheduleRun.objects.filter(schedule=schedule, due_at=now).exists():
            raise actions.Refused("schedule: it was started at this very moment already")
        run = ScheduleRun.objects.create(schedule=schedule, due_at=now, missed=0, fired_by=actor)
        return _start(schedule, run, actor=actor)


def _start(schedule: Schedule, run: ScheduleRun, *, actor: str) -> ScheduleRun:
    """The run's message and task, in the caller's transaction (or its failure, journaled)."""
    due_at, missed = run.due_at, run.missed
    data = {**_named(schedule), "run": run.pk, "due_at": due_at.isoformat(), "missed": missed}
    try:
        spec = plans.validate(schedule.plan)
    except plans.PlanError as exc:
        error = "the plan template no longer validates: " + "; ".join(exc.errors)
        ScheduleRun.objects.filter(pk=run.pk).update(error=error)
        Schedule.objects.filter(pk=schedule.pk).update(last_error=error)
        journal.record(EventKind.SCHEDULE_FAILED, actor=actor, error=error, **data)
        log.error("%s: run due %s failed: %s", schedule, due_at.isoformat(), error)
        run.error = error
        return run
    author = f"schedule:{schedule.name}"
    run.message = conversation.post(
        author=author,
        kind=AuthorKind.SCHEDULE,
        text=f"[SCHEDULED TASK] {schedule.name}",
        user=SYSTEM,
    )
    ScheduleRun.objects.filter(pk=run.pk).update(message=run.message)
    task = actions.create_task(
        plan=spec, actor=author, user=SYSTEM, origin=Origin.SCHEDULE, run=run
    )
    if schedule.last_error:
        Schedule.objects.filter(pk=schedule.pk).update(last_error="")
    journal.record(EventKind.SCHEDULE_FIRED, task=task, actor=actor, message=run.message.pk, **data)
    return run


def _named(schedule: Schedule) -> dict[str, Any]:
    return {"schedule": schedule.name, "schedule_id": schedule.pk}


def schedule_dict(schedule: Schedule) -> dict[str, Any]:
    last = schedule.runs.order_by("-due_at").first()
    return {
        "id": schedule.pk,
        "name": schedule.name,
        "cron": schedule.cron,
        "timezone": schedule.timezone,
        "enabled": schedule.enabled,
        "next_due": schedule.next_due.isoformat() if schedule.enabled else None,
        "last_run": run_dict(last) if last else None,
        "last_error": schedule.last_error,
        "plan": schedule.plan,
    }


def run_dict(run: ScheduleRun) -> dict[str, Any]:
    task_ids = list(run.tasks.values_list("pk", flat=True))
    return {
        "id": run.pk,
        "due_at": run.due_at.isoformat(),
        "fired_at": run.fired_at.isoformat(),
        "missed": run.missed,
        "message": run.message_id,
        "task": task_ids[0] if task_ids else None,
        "error": run.error,
    }
