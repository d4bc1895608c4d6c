"""Plans for the model judge (DESIGN.md §12, §13): `judge: model` on a step or on the plan,
`instructions`, `tools`; every refusal names the field or the setting, nothing is created."""

from __future__ import annotations

from typing import Any

import pytest

from loop import actions, plans
from loop.models import Step, Task
from loop.permissions import SYSTEM

pytestmark = pytest.mark.django_db


@pytest.fixture
def model_configured(settings: Any) -> None:
    settings.LOOP_LLM_BASE_URL = "http://127.0.0.1:9/v1"


def refusal(plan: dict[str, Any]) -> str:
    with pytest.raises(plans.PlanError) as caught:
        plans.validate(plan)
    return str(caught.value)


def test_a_model_plan_is_stored_with_its_instructions_and_tools(model_configured: None) -> None:
    spec = plans.validate(
        {
            "title": "Weekly digest",
            "judge": "model",
            "instructions": "Tell Dad what changed this week.",
            "steps": [
                {"key": "look", "instructions": "Read the page."},
                {"key": "sum", "tool": "echo", "args": {"value": 1}},
                {
                    "key": "mail",
                    "instructions": "Mail Dad the summary.",
                    "tools": ["email.send", "http.get"],
                    "side_effect": True,
                    "confirm_before": True,
                },
            ],
        }
    )
    task = actions.create_task(plan=spec, actor="test", user=SYSTEM)
    assert task.instructions == "Tell Dad what changed this week."
    look, add, mail = task.steps.order_by("position")
    assert (look.judge, look.instructions, look.tools, look.tool) == (
        "model",
        "Read the page.",
        [],
        "",
    )
    assert add.judge == "tool"  # a step with a tool keeps the tool judge
    assert (mail.judge, mail.tools, mail.side_effect, mail.confirm_before) == (
        "model",
        ["email.send", "http.get"],
        True,
        True,
    )


def test_a_model_step_without_a_configured_model_names_the_setting() -> None:
    message = refusal(
        {"title": "t", "steps": [{"key": "a", "judge": "model", "instructions": "do it"}]}
    )
    assert "step 'a'" in message and "LOOP_LLM_BASE_URL" in message
    assert not Task.objects.exists()


@pytest.mark.parametrize(
    ("step", "named"),
    [
        ({"key": "a", "judge": "model"}, "step 'a': 'instructions' is required"),
        (
            {"key": "a", "judge": "model", "instructions": "x", "tools": ["nope.tool"]},
            "step 'a': tools: unknown tool 'nope.tool'",
        ),
        (
            {"key": "a", "judge": "model", "instructions": "x", "tools": ["http.post"]},
            "step 'a': tools: 'http.post' has side effects; the step needs 'side_effect: true'",
        ),
        (
            {"key": "a", "judge": "model", "instructions": "x", "tools": "http.get"},
            "step 'a': 'tools' must be a list of tool names",
        ),
        ({"key": "a", "judge": "robot", "tool": "echo"}, "step 'a': 'judge' must be"),
        (
            {"key": "a", "judge": "model", "instructions": "x", "tool": "echo"},
            "step 'a': 'tool' is for the tool judge",
        ),
        (
            {"key": "a", "tool": "echo", "args": {"value": 1}, "tools": ["echo"]},
            "step 'a': 'tools' is for a model step",
        ),
    ],
)
def test_a_bad_model_step_is_refused_naming_the_field(
    model_configured: None, step: dict[str, Any], named: str
) -> None:
    assert named in refusal({"title": "t", "steps": [step]})
    assert not Step.objects.exists()


def test_a_bad_plan_judge_or_instructions_is_refused(model_configured: None) -> None:
    assert "judge: must be 'tool' or 'model'" in refusal(
        {"title": "t", "judge": "x", "steps": [{"key": "a", "tool": "echo"}]}
    )
    assert "instructions: must be a string" in refusal(
        {"title": "t", "instructions": 3, "steps": [{"key": "a", "tool": "echo"}]}
    )


def test_added_steps_may_be_model_steps(model_configured: None) -> None:
    task = actions.create_task(
        plan=plans.validate(
            {"title": "t", "steps": [{"key": "a", "tool": "echo", "args": {"value": 1}}]}
        ),
        actor="test",
        user=SYSTEM,
    )
    [added] = actions.add_steps(
        task_id=task.pk,
        steps=[{"key": "b", "judge": "model", "instructions": "go on"}],
        actor="test",
        user=SYSTEM,
    )
    assert (added.judge, added.instructions) == ("model", "go on")
