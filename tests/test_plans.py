"""Plan files are validated whole; errors name the step and the field; nothing half-created."""

from __future__ import annotations

import pytest

from loop import plans
from loop.models import Step, Task

from .conftest import make_task, step


def errors_of(data: object) -> list[str]:
    with pytest.raises(plans.PlanError) as caught:
        plans.validate(data)
    return caught.value.errors


def test_yaml_and_json_give_the_same_plan() -> None:
    yaml_text = "title: T\nsteps:\n  - {key: a, tool: echo, args: {value: 1}}\n"
    json_text = '{"title": "T", "steps": [{"key": "a", "tool": "echo", "args": {"value": 1}}]}'
    assert plans.parse(yaml_text) == plans.parse(json_text)


def test_errors_name_step_and_field() -> None:
    found = errors_of(
        {
            "title": "",
            "steps": [
                {"key": "email-dad", "tool": "email.send", "args": {"subject": "hi", "body": "x"}},
                {"key": "email-dad", "tool": "nope"},
                {"tool": "echo", "args": {"value": 1}},
                {"key": "b", "tool": "echo", "args": {"value": "${later.x}"}},
                {"key": "c", "tool": "sleep", "args": {"seconds": "soon"}},
                {"key": "d", "tool": "echo", "args": {"value": 1}, "max_attempts": 0},
            ],
        }
    )
    assert "title: required, a non-empty string" in found
    assert "step 'email-dad': tool 'email.send' needs 'to'" in found
    assert "step 'email-dad': key is used twice" in found
    assert any(e.startswith("step 'email-dad': unknown tool 'nope'") for e in found)
    assert any(e.startswith("steps[2]: 'key' is required") for e in found)
    assert "step 'b': args refer to 'later', which is not an earlier step" in found
    assert "step 'c': 'seconds' must be number" in found
    assert "step 'd': 'max_attempts' must be a whole number from 1 to 100" in found


def test_each_problem_is_named_once() -> None:
    assert errors_of({"title": 5}) == [
        "title: required, a non-empty string",
        "steps: required, a non-empty list",
    ]


def test_side_effect_tool_cannot_be_declared_read_only() -> None:
    found = errors_of(
        {
            "title": "T",
            "steps": [
                {
                    "key": "w",
                    "tool": "file.write",
                    "side_effect": False,
                    "args": {"path": "a", "content": "b"},
                }
            ],
        }
    )
    assert found == ["step 'w': tool 'file.write' has side effects; 'side_effect' can't be false"]


@pytest.mark.parametrize("text", ["{not json", "title: [unclosed", "- just a list", "42"])
def test_unparseable_plans_are_refused(text: str) -> None:
    with pytest.raises(plans.PlanError):
        plans.parse(text)


def test_invalid_plan_creates_nothing(db: None) -> None:
    with pytest.raises(plans.PlanError):
        make_task(step("a"), step("a"))
    assert not Task.objects.exists() and not Step.objects.exists()


def test_references_fill_from_earlier_outputs() -> None:
    outputs = {"a": {"value": {"n": 3, "list": [1, 2]}}}
    assert plans.resolve("${a.value.n}", outputs) == 3
    assert plans.resolve("n=${a.value.n}", outputs) == "n=3"
    assert plans.resolve({"x": ["${a.value.list.1}"]}, outputs) == {"x": [2]}
