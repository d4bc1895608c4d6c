"""The conversation and schedules (DESIGN.md §10): Message, Schedule, ScheduleRun.

Imported by `loop.models`, so they belong to the `loop` app like every other model.
"""

from __future__ import annotations

from django.db import models
from django.utils.timezone import now


class AuthorKind(models.TextChoices):
    USER = "user", "User"
    """A person: at the dashboard, or at the shell (`manage.py say`)."""
    AGENT = "agent", "Agent"
    """An outside agent over the API."""
    SCHEDULE = "schedule", "Schedule"
    """A schedule's run: `[SCHEDULED TASK] <name>`."""
    PIPPA = "pippa", "Pippa"
    """Pippa, the model, with the `say` tool (a message, not a side effect in the world)."""


class Message(models.Model):
    """One message of the one conversation, in id order. The standing authorization compares
    a task's origin message with the latest id (the primary key's index answers that)."""

    author = models.CharField(max_length=150)
    author_kind = models.CharField(max_length=16, choices=AuthorKind.choices)
    text = models.TextField()
    created_at = models.DateTimeField(default=now)
    # A task Pippa proposed with this message (a conversation turn): Dad approves or declines
    # it in the conversation, as any plan she writes.
    proposal = models.ForeignKey(
        "loop.Task", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # A schedule Pippa proposed with this message (a plan with `schedule`), until Dad answers:
    # approving creates it as his; `answer` says who approved or declined it.
    proposed_schedule = models.JSONField(null=True, blank=True)
    answer = models.CharField(max_length=300, blank=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"message {self.pk} by {self.author}"


class Schedule(models.Model):
    """Dad's instruction written ahead of time: a plan template run at each due time."""

    name = models.CharField(max_length=200, unique=True)
    cron = models.CharField(max_length=200)  # parsed by cronsim, in `timezone`
    timezone = models.CharField(max_length=64)
    plan = models.JSONField()  # the plan template (a plan without schedule/timezone)
    enabled = models.BooleanField(default=True)
    # The next due time not yet fired (UTC). Firing is a compare-and-set on it.
    next_due = models.DateTimeField()
    last_run_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    created_by = models.CharField(max_length=150, blank=True)
    created_at = models.DateTimeField(default=now)

    class Meta:
        # Each worker's poll: enabled AND next_due <= now.
        indexes = [models.Index(fields=["enabled", "next_due"], name="schedule_due")]

    def __str__(self) -> str:
        return f"schedule {self.name!r}"


class ScheduleRun(models.Model):
    """One fired due time. The unique (schedule, due_at) pair is the slot's claim: a second
    worker's insert for the same slot fails, so a slot fires once however many workers run."""

    schedule = models.ForeignKey(Schedule, on_delete=models.CASCADE, related_name="runs")
    due_at = models.DateTimeField()
    fired_at = models.DateTimeField(default=now)
    missed = models.PositiveIntegerField(default=0)  # earlier slots folded into this run
    message = models.ForeignKey(Message, null=True, blank=True, on_delete=models.SET_NULL)
    error = models.TextField(blank=True)  # the template no longer validates: no task
    fired_by = models.CharField(max_length=150, blank=True)

    class Meta:
        ordering = ["-due_at"]
        constraints = [
            models.UniqueConstraint(fields=["schedule", "due_at"], name="schedule_run_slot"),
        ]

    def __str__(self) -> str:
        return f"run of {self.schedule_id} due {self.due_at.isoformat()}"
