"""A question names exactly the effects it is about (DESIGN.md §5, §13 `question.effects`)."""

from __future__ import annotations

from loop.models import Effect, Step
from loop.serialize import question_dict

from .conftest import make_task, step


def blocked_step_with_effects(kind: str, states: dict[str, str]) -> Step:
    """A blocked step holding one effect per state. The tool judge makes one effect per step;
    a judge that makes several calls (Pippa) can leave them in different states."""
    task = make_task(step("send", "http.post", args={"url": "http://127.0.0.1:9/hook"}))
    row = task.steps.get()
    for name, state in states.items():
        Effect.objects.create(
            id=name * 64,
            task=task,
            step=row,
            tool="http.post",
            target=f"POST {name}",
            state=state,
            request=row.args,
        )
    Step.objects.filter(pk=row.pk).update(state="blocked", question_kind=kind, question_text="?")
    return Step.objects.get(pk=row.pk)


def test_did_it_happen_names_only_effects_whose_outcome_is_unknown(db: None) -> None:
    asked = blocked_step_with_effects(
        "did_it_happen", {"a": "succeeded", "b": "uncertain", "c": "pending"}
    )
    question = question_dict(asked, list(asked.effects.order_by("id")))
    assert question is not None
    assert [e["id"] for e in question["effects"]] == ["b" * 64]


def test_may_i_names_only_effects_not_sent_yet(db: None) -> None:
    asked = blocked_step_with_effects("may_i", {"a": "succeeded", "c": "pending"})
    question = question_dict(asked, list(asked.effects.order_by("id")))
    assert question is not None
    assert [e["id"] for e in question["effects"]] == ["c" * 64]


def test_may_i_names_not_an_earlier_calls_intent_left_by_an_edit(db: None) -> None:
    """An edit after an unsent try leaves the old call's intent pending (never sent): the
    question shows the call that would run now, not the old one."""
    asked = blocked_step_with_effects("may_i", {"c": "pending"})
    Step.objects.filter(pk=asked.pk).update(args={"url": "http://127.0.0.1:9/other"})
    asked = Step.objects.get(pk=asked.pk)
    question = question_dict(asked, list(asked.effects.order_by("id")))
    assert question is not None
    assert question["effects"] == []
    assert question["call"] is not None
    assert "http://127.0.0.1:9/other" in str(question["call"]["request_view"])
