"""Dashboard forms. Plans are parsed and validated here (errors beside the field); the
change itself is always made by `loop.actions`."""

from __future__ import annotations

from typing import Any

from django import forms

from .. import numbers, plans
from ..actions import DECISIONS


class WholeNumberField(forms.IntegerField):
    """A whole number typed in ASCII digits (`loop.numbers`): Django's own IntegerField takes
    '١٢' and '１２' for 12 through int()."""

    def to_python(self, value: Any) -> int | None:
        if value in self.empty_values:
            return None
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        try:
            return numbers.whole(str(value).strip(), "value")
        except numbers.NotANumber:
            raise forms.ValidationError(self.error_messages["invalid"], code="invalid") from None


def _plan_text(text: str, upload: Any) -> bytes | str:
    """The pasted text, or the uploaded file's bytes (one past the limit at most):
    `plans.parse` decodes and bounds both."""
    if upload is not None:
        return bytes(upload.read(plans.max_bytes() + 1))
    if not text.strip():
        raise forms.ValidationError({"plan": "paste a plan or choose a file"})
    return text


class PlanForm(forms.Form):
    """A whole plan (new task, or the successor of a superseded one)."""

    plan = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 14, "spellcheck": "false", "class": "code"}),
        help_text="YAML or JSON: title, steps: [{key, tool, args, …}]",
    )
    file = forms.FileField(required=False, help_text="…or upload a .yaml / .json plan file")

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if self.errors:
            return data
        text = _plan_text(data.get("plan", ""), data.get("file"))
        field = "file" if data.get("file") is not None else "plan"
        try:
            data["spec"] = plans.parse(text)
        except plans.PlanError as exc:
            raise forms.ValidationError({field: exc.errors}) from None
        return data


class NewTaskForm(PlanForm):
    """A new task: a whole plan, or a goal in words that Pippa plans (`goal`), not both. The
    goal is checked by the action (`actions.create_task_from_goal`), which names the field."""

    field_order = ["goal", "plan", "file"]
    goal = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="…or a goal in words: Pippa writes the plan (needs a model)",
    )

    def clean(self) -> dict[str, Any]:
        data = forms.Form.clean(self) or {}
        if self.errors:
            return data
        goal = data.get("goal", "").strip()
        has_plan = bool(data.get("plan", "").strip()) or data.get("file") is not None
        if goal and has_plan:
            raise forms.ValidationError({"goal": "either a plan or a goal, not both"})
        if not goal and not has_plan:
            raise forms.ValidationError({"goal": "write a goal, or paste a plan or choose a file"})
        if goal:
            data["goal"] = goal
            return data
        return super().clean()


class AddStepsForm(forms.Form):
    after = forms.ChoiceField(required=False, label="After step")
    steps = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 8, "spellcheck": "false", "class": "code"}),
        help_text="YAML or JSON: a list of steps, or {steps: [...]}",
    )

    def __init__(self, *args: Any, keys: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        after = self.fields["after"]
        assert isinstance(after, forms.ChoiceField)
        after.choices = [("", "the end of the plan"), *((k, k) for k in keys)]

    def clean_steps(self) -> Any:
        try:
            loaded = plans.load(self.cleaned_data["steps"])
        except plans.PlanError as exc:
            raise forms.ValidationError(exc.errors) from None
        if isinstance(loaded, dict) and set(loaded) == {"steps"}:
            loaded = loaded["steps"]
        if not isinstance(loaded, list) or not loaded:
            raise forms.ValidationError("steps: a non-empty list of steps")
        return loaded


class DecisionForm(forms.Form):
    decision = forms.ChoiceField(choices=[(d, d) for d in (*DECISIONS, "reply")])
    note = forms.CharField(required=False, max_length=2000, strip=False)
