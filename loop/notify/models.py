"""The notifier's rows (`loop` models: `loop.models` imports them)."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone


class NotifyCursor(models.Model):
    """One channel's place in the journal: the last event id whose news it delivered."""

    channel = models.CharField(max_length=20, primary_key=True)
    last_event = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        app_label = "loop"

    def __str__(self) -> str:
        return f"{self.channel} told up to event {self.last_event}"


class QuestionNotice(models.Model):
    """A question Dad was told of, for its reminders (LOOP_REMIND_AFTER, LOOP_REMIND_TIMES).
    `asked_event` names the asking: a step asked again is a new question."""

    step = models.OneToOneField("loop.Step", on_delete=models.CASCADE, related_name="notice")
    asked_event = models.BigIntegerField()
    asked_at = models.DateTimeField()
    reminded = models.PositiveIntegerField(default=0)
    reminded_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        app_label = "loop"

    def __str__(self) -> str:
        return f"question of step {self.step_id}, reminded {self.reminded}×"


class PushSubscription(models.Model):
    """One browser's Web Push subscription (its endpoint and keys), for one person."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="push_subscriptions"
    )
    endpoint = models.URLField(max_length=2000, unique=True)
    p256dh = models.CharField(max_length=200)
    auth = models.CharField(max_length=100)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        app_label = "loop"

    def __str__(self) -> str:
        return f"push subscription {self.pk} of {self.user_id}"
