"""The admin for plans (DESIGN.md §13, §15 invariant 10).

A task with its steps inline: pending steps' plan fields are editable and reorderable (by
position); running, done, failed and blocked steps are read-only, and so is the call (tool,
args) of a pending step that has an effect beyond `pending` — each says why. Nothing is saved
through the model: `save_model` writes nothing, and `save_formset` hands only the changed plan
fields to `actions.edit_steps`, which writes them with a compare-and-set on state='pending' and
journals each edit. So an admin save can never overwrite what the loop writes (state,
attempts, lease, outputs, effects, errors, questions), even when the loop commits while the
form is open; a step that left pending meanwhile is left alone and the admin says so.
The journal, effects and workers are read-only.
"""

from __future__ import annotations

import copy
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Model, QuerySet
from django.forms.models import BaseInlineFormSet
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from . import actions, calls, numbers, plans
from .models import TASK_STATE_WORDS, AgentToken, Effect, Event, Step, StepState, Task, Worker
from .states import STEP
from .web.forms import WholeNumberField
from .web.pages import context
from .web.pages.login import AdminLoginForm
from .web.words import person, plain_error

EDITABLE = ("position", *actions.PLAN_FIELDS)
admin.site.login_form = AdminLoginForm  # the admin's login is throttled like ours
admin.site.site_header = admin.site.site_title = "Pippa Loop admin"
admin.site.index_title = "The loop's records"
WHY_READ_ONLY = {
    StepState.RUNNING: "running: the loop is working on it",
    StepState.BLOCKED: "blocked: it waits for an answer to its question",
    **{state: f"{state}: it never runs again" for state in STEP.terminal},
}


def why_read_only(step: Step) -> str:
    """Why the admin can't change this step, or its call ("" if it can)."""
    if step.pk is None:
        return ""
    if step.state != StepState.PENDING:
        return WHY_READ_ONLY.get(StepState(step.state), step.state)
    return calls.why_fixed(step)


class StepForm(forms.ModelForm):
    # The state the person saw when the form was drawn: a step that left pending since is
    # not touched, and the admin says so.
    seen_state = forms.CharField(widget=forms.HiddenInput, required=False)

    class Meta:
        model = Step
        fields = ("position", "key", *actions.PLAN_FIELDS)
        field_classes = {"position": WholeNumberField, "max_attempts": WholeNumberField}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["key"].disabled = True  # later steps refer to it by key
        self.fields["seen_state"].initial = self.instance.state
        if self.instance.pk is None or self.instance.state != StepState.PENDING:
            for field in self.fields.values():
                field.disabled = True
        elif calls.why_fixed(self.instance):
            for name in calls.CALL_FIELDS:
                self.fields[name].disabled = True

    @property
    def editable(self) -> bool:
        return not self.fields["position"].disabled

    def clean(self) -> dict[str, Any]:
        """The step as edited, checked by the plans' own rule (`plans.check_step`), each error
        beside its field; `actions.edit_steps` checks it again when it writes."""
        data = super().clean() or {}
        if not self.editable or not self.has_changed():
            return data
        fields = {
            "key": self.instance.key,
            **{n: data[n] for n in actions.PLAN_FIELDS if n in data},
        }
        if len(fields) <= len(actions.PLAN_FIELDS):
            return data  # a field that did not read already says why
        for name, error in plans.check_step(fields, where=f"step '{self.instance.key}'").problems:
            self.add_error(name if name in self.fields else None, error)
        return data

    def validate_unique(self) -> None:
        """Positions are swapped by `actions.edit_steps`, which keeps (task, position) unique
        at every statement; checking each row alone against the old order would refuse any
        reordering."""

    def changes(self) -> dict[str, Any]:
        if not self.editable or self.errors or not hasattr(self, "cleaned_data"):
            return {}
        return {name: self.cleaned_data[name] for name in self.changed_data if name in EDITABLE}

    def stale_edits(self) -> list[str]:
        """Fields the person changed on a step that was pending when the form was drawn but
        is not any more (the loop started or finished it): those edits are dropped."""
        if self.editable or self.data.get(self.add_prefix("seen_state")) != StepState.PENDING:
            return []
        names = []
        for name in EDITABLE:
            field = copy.copy(self.fields[name])
            field.disabled = False
            raw = field.widget.value_from_datadict(self.data, self.files, self.add_prefix(name))
            if field.has_changed(self.get_initial_for_field(field, name), raw):
                names.append(name)
        return names


class StepFormSet(BaseInlineFormSet):
    """The task's steps as forms: a window of them (a 10,000-step task is not 10,000 forms).
    Drawn, the window around the current step (or from `?steps_from=POSITION`); posted, the
    steps whose ids the form carried, so a loop that moved on meanwhile shifts nothing."""

    window: tuple[int, int] | None = None  # positions [from, to) to draw; set per request

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        assert self.queryset is not None  # the inline's steps of this task
        if self.is_bound:
            # Read before Django's own check of the management form: a count or an id that is
            # no whole number names no step here (that check then refuses the form).
            total = _whole_or_none(self.data.get(f"{self.prefix}-TOTAL_FORMS"), high=MAX_FORMS)
            ids = [
                _whole_or_none(self.data.get(f"{self.prefix}-{n}-id"), high=MAX_ID)
                for n in range(total or 0)
            ]
            self.queryset = self.queryset.filter(pk__in=[i for i in ids if i is not None])
        elif self.window is not None:
            low, high = self.window
            self.queryset = self.queryset.filter(position__gte=low, position__lt=high)

    def clean(self) -> None:
        super().clean()
        moved = [f for f in self.forms if isinstance(f, StepForm) and "position" in f.changes()]
        if not moved:
            return
        new = sorted(f.cleaned_data["position"] for f in moved)
        old = sorted(f.instance.position for f in moved)
        if new != old:
            raise forms.ValidationError(
                "position: pending steps can only be reordered among themselves "
                f"(swap the numbers {', '.join(map(str, old))})"
            )


MAX_FORMS = 1000  # Django's own bound on a formset's forms (DATA_UPLOAD_MAX_NUMBER_FIELDS…)
MAX_ID = 2**63 - 1
MAX_POSITION = 2**31 - 1


def _whole_or_none(raw: Any, *, high: int) -> int | None:
    try:
        return numbers.whole(raw if isinstance(raw, str) else None, "value", low=0, high=high)
    except numbers.NotANumber:
        return None


def steps_from(request: HttpRequest) -> int | None:
    """`?steps_from=POSITION`: where the drawn window of steps begins (None: around the current
    step); NotANumber naming it unless a whole number."""
    raw = request.GET.get("steps_from")
    if raw is None or raw == "":
        return None
    return numbers.whole(raw, "steps_from", low=0, high=MAX_POSITION)


class StepInline(admin.TabularInline):
    model = Step
    form = StepForm
    formset = StepFormSet
    extra = 0
    can_delete = False
    ordering = ("position",)
    fields = (
        "position",
        "key",
        *actions.PLAN_FIELDS,
        "state",
        "attempts",
        "what_failed",
        "written",
        "read_only",
        "seen_state",
    )
    readonly_fields = ("state", "attempts", "what_failed", "written", "read_only")
    show_change_link = False

    @admin.display(description="read-only because")
    def read_only(self, step: Step) -> str:
        return why_read_only(step)

    @admin.display(description="written by")
    def written(self, step: Step) -> str:
        proposed = " (proposed: waits for approval)" if step.proposed else ""
        return f"{step.get_writer_display()} {person(step.written_by)}{proposed}"

    @admin.display(description="error")
    def what_failed(self, step: Step) -> str:
        return plain_error(step.error)

    def has_add_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False  # new steps come through "add steps" (dashboard, API), never half-made here

    def get_formset(self, request: HttpRequest, obj: Any = None, **kwargs: Any) -> Any:
        """This request's formset class (and this inline, made for this request too) drawing
        the window of steps; the heading says which and links to the neighbouring ones."""
        formset = super().get_formset(request, obj, **kwargs)
        if isinstance(obj, Task):
            window = context.step_window(obj, steps_from(request))
            if window.steps:
                ours: Any = formset
                ours.window = (window.steps[0].position, window.steps[-1].position + 1)
            links = [("all steps on the task page", reverse("loop:task", args=[obj.pk]))]
            if window.earlier is not None:
                links.append(("earlier", f"?steps_from={window.earlier}"))
            if window.later is not None:
                links.append(("later", f"?steps_from={window.later}"))
            self.verbose_name_plural = format_html(
                "steps {}–{} of {} ({} done) · {}",
                window.first,
                window.last,
                window.total,
                window.done,
                format_html_join(" · ", '<a href="{1}">{0}</a>', links),
            )
        return formset


class TaskStateFilter(admin.SimpleListFilter):
    """The task's state, by its words (TASK_STATE_WORDS), not its choice labels."""

    title = "state"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(str(state), words) for state, words in TASK_STATE_WORDS.items()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(state=self.value()) if self.value() else queryset


@admin.register(Task)
class TaskAdmin(admin.ModelAdmin):
    """Only the plan's pending steps are edited here; every field of the task itself is shown
    read-only (as text, not as a field that looks editable and whose change is dropped)."""

    list_display = ("id", "title", "status", "made_by", "created_at")
    list_filter = (TaskStateFilter,)
    search_fields = ("title",)
    inlines = [StepInline]
    exclude = ("created_by",)

    def get_readonly_fields(self, request: HttpRequest, obj: Model | None = None) -> list[str]:
        shown = [f.name for f in Task._meta.concrete_fields if f.name not in ("id", "created_by")]
        return ["made_by", *shown]

    @admin.display(description="state", ordering="state")
    def status(self, task: Task) -> str:
        return task.get_state_display()

    @admin.display(description="created by")
    def made_by(self, task: Task) -> str:
        return person(task.created_by)

    def message_user(self, request: HttpRequest, message: Any, *args: Any, **kwargs: Any) -> None:
        """Django's "was changed successfully" only when a step was edited: a save that
        changed nothing says so."""
        said = str(message)
        if "changed successfully" in said and not getattr(request, "_loop_edited", False):
            message, args = "Nothing was changed.", (messages.INFO, *args[1:])
            kwargs.pop("level", None)
        super().message_user(request, message, *args, **kwargs)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # tasks are created from plans (dashboard, API, `manage.py plan`)

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        try:
            steps_from(request)  # read again by the inline's formset, which can't answer a 400
        except numbers.NotANumber as exc:
            return HttpResponseBadRequest(f"{exc} (a step position)", content_type="text/plain")
        return super().change_view(request, object_id, form_url, extra_context)

    def has_delete_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: Task, form: Any, change: bool) -> None:
        """Nothing on the task itself is edited here; saving the row would write back every
        column as it was read, including what the loop changed since."""

    def save_formset(self, request: HttpRequest, form: Any, formset: Any, change: bool) -> None:
        # What the admin's history message reads; only what actions.edit_steps applied.
        formset.new_objects, formset.changed_objects, formset.deleted_objects = [], [], []
        for stale in (f.instance for f in formset.forms if f.stale_edits()):
            self._not_changed(request, stale)
        edits = {f.instance.pk: f.changes() for f in formset.forms if f.changes()}
        if not edits:
            return
        task = form.instance
        try:
            edited, skipped = actions.edit_steps(
                task_id=task.pk,
                edits=edits,
                actor=f"admin:{request.user.get_username()}",
                user=request.user,
            )
        except (actions.Refused, plans.PlanError, PermissionDenied) as exc:
            self.message_user(request, f"Nothing was changed: {exc}", messages.ERROR)
            return
        formset.changed_objects = [(s, sorted(edits[s.pk])) for s in edited]
        request._loop_edited = bool(edited)  # type: ignore[attr-defined]
        if edited:
            keys = ", ".join(f"'{s.key}'" for s in edited)
            self.message_user(request, f"Plan edited: {keys}.", messages.SUCCESS)
        for step in skipped:
            self._not_changed(request, step)

    def _not_changed(self, request: HttpRequest, step: Step) -> None:
        self.message_user(
            request,
            f"Step '{step.key}' was not changed: it left pending (the loop started or "
            "finished it) while the form was open.",
            messages.WARNING,
        )


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False


@admin.register(Event)
class EventAdmin(ReadOnlyAdmin):
    list_display = ("id", "created_at", "kind", "task", "step", "who")
    list_filter = ("kind",)
    list_select_related = ("task", "step")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Event]:
        return super().get_queryset(request).order_by("-id")

    @admin.display(description="by", ordering="actor")
    def who(self, event: Event) -> str:
        return person(event.actor)


@admin.register(Effect)
class EffectAdmin(ReadOnlyAdmin):
    list_display = ("effect", "tool", "target", "state", "sends", "step", "updated_at")
    list_filter = ("state", "tool")

    @admin.display(description="effect", ordering="id")
    def effect(self, effect: Effect) -> str:
        """Its id cut to 8 characters (the whole is its idempotency key, on its page)."""
        return f"{str(effect.pk)[:8]}…"


@admin.register(Worker)
class WorkerAdmin(ReadOnlyAdmin):
    list_display = ("id", "label", "host", "pid", "state", "last_seen", "parked_reason")
    list_filter = ("state",)


@admin.register(AgentToken)
class AgentTokenAdmin(ReadOnlyAdmin):
    """Tokens are made and revoked with `manage.py agent_token`; only their digest is stored,
    and it is not shown."""

    list_display = ("name", "prefix", "user", "created_at", "last_used_at", "expires_at", "revoked")
    list_filter = ("revoked",)
    fields = ("name", "prefix", "user", "created_at", "last_used_at", "expires_at", "revoked")


from . import admin_schedules as _schedules  # noqa: E402, F401  (registers its admins)
