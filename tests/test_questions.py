"""A question names exactly the effects it is about (DESIGN.md §5, §13 `question.effects`)."""

from __future__ import annotations

import io

from django.core.management import call_command

from loop import questions
from loop.models import Effect, Step
from loop.serialize import question_dict
from loop.web.pages import context

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


def test_the_dashboard_the_api_and_the_cli_name_the_same_effects(db: None) -> None:
    asked = blocked_step_with_effects(
        "did_it_happen", {"a": "succeeded", "b": "uncertain", "c": "pending"}
    )
    card = context.needs_you()
    assert [[e.pk for e in q.effects] for q in card] == [["b" * 64]]
    api = question_dict(asked, list(asked.effects.order_by("id")))
    assert api is not None and [e["id"] for e in api["effects"]] == ["b" * 64]
    out = io.StringIO()
    call_command("task", str(asked.task_id), stdout=out)
    shown = [line.strip() for line in out.getvalue().splitlines() if " → " in line]
    assert shown == ["http.post → POST b"]

    out = io.StringIO()
    call_command("unblock", str(asked.pk), "--happened", stdout=out)
    settled = [line.strip() for line in out.getvalue().splitlines() if "effect" in line]
    assert settled == [f"effect {'b' * 12} http.post → POST b: succeeded"]
    states = dict(Effect.objects.values_list("id", "state"))
    assert states == {"a" * 64: "succeeded", "b" * 64: "succeeded", "c" * 64: "pending"}


def test_may_i_about_an_intent_that_never_went_out_says_so_from_the_rows(db: None) -> None:
    unsent = blocked_step_with_effects("may_i", {"c": "pending"})
    found = questions.question(unsent, unsent.effects.all())
    assert found is not None and found.own_call is None
    assert found.notes == [questions.UNSENT]
    first = blocked_step_with_effects("may_i", {})
    found = questions.question(first, [])
    assert found is not None and found.own_call is not None and found.notes == []


def test_a_step_that_is_not_blocked_has_no_question(db: None) -> None:
    asked = blocked_step_with_effects("may_i", {})
    Step.objects.filter(pk=asked.pk).update(state="pending")
    left = Step.objects.get(pk=asked.pk)
    assert questions.question(left, []) is None and question_dict(left, []) is None
