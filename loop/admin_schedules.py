"""The admin for schedules and the conversation (DESIGN.md §10). A schedule's name, cron,
time zone, plan template and on/off switch are edited here, validated whole (each error beside
its field) and written by `schedules.create` / `schedules.edit`, which journal the change and
set the next due time. Runs and messages are read-only."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Model
from django.http import HttpRequest

from . import actions, plans, schedules
from .models import Message, Schedule, ScheduleRun

FIELD_OF = {"name": "name", "schedule": "cron", "timezone": "timezone", "plan": "plan"}


class ScheduleForm(forms.ModelForm):
    class Meta:
        model = Schedule
        fields = ("name", "cron", "timezone", "plan", "enabled")

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if self.errors:
            return data
        probe = Schedule(**{k: data.get(k) for k in self.Meta.fields})
        for error in schedules.validate(probe):
            field = FIELD_OF.get(error.split(":", 1)[0], None)
            self.add_error(field, error)
        return data


class RunInline(admin.TabularInline):
    model = ScheduleRun
    fields = ("due_at", "fired_at", "missed", "message", "error", "fired_by")
    readonly_fields = fields
    extra = 0
    can_delete = False
    ordering = ("-due_at",)

    def has_add_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False


@admin.register(Schedule)
class ScheduleAdmin(admin.ModelAdmin):
    form = ScheduleForm
    list_display = ("name", "cron", "timezone", "enabled", "next_due", "last_run_at", "last_error")
    readonly_fields = ("next_due", "last_run_at", "last_error", "created_by", "created_at")
    inlines = [RunInline]

    def has_delete_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False  # switch it off instead: that is journaled, and its runs stay readable

    def save_model(self, request: HttpRequest, obj: Schedule, form: Any, change: bool) -> None:
        actor = f"admin:{request.user.get_username()}"
        data = form.cleaned_data
        if not change:
            spec = plans.validate(
                {**data["plan"], "schedule": data["cron"], "timezone": data["timezone"]}
            )
            created = schedules.create(spec=spec, actor=actor, user=request.user, name=data["name"])
            obj.pk = created.pk
            if not data["enabled"]:
                schedules.edit(
                    schedule_id=created.pk,
                    changes={"enabled": False},
                    actor=actor,
                    user=request.user,
                )
            return
        changes = {name: data[name] for name in form.changed_data if name in schedules.EDITABLE}
        try:
            schedules.edit(schedule_id=obj.pk, changes=changes, actor=actor, user=request.user)
        except (actions.Refused, plans.PlanError, PermissionDenied) as exc:
            # The refusal's event commits with the admin's transaction, which goes on.
            self.message_user(request, f"Nothing was changed: {exc}", messages.ERROR)


@admin.register(Message)
class MessageAdmin(admin.ModelAdmin):
    list_display = ("id", "created_at", "author", "author_kind", "text")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False
