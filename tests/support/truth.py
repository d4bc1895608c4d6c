"""A person who answers the loop's questions as the truth demands, and checks each question
was one the database could not answer itself (DESIGN.md §5).

The truth is what the sinks received: "Did this happen?" is answered `happened` if the sink
got the effect and `rerun` if not; "May I do this?" after a cut must be about a call that
provably never went out (the sink never got it), and is allowed.
"""

from __future__ import annotations

from collections import Counter

from loop import actions, plans
from loop.effects import effect_id
from loop.models import EffectState, Event, Step, StepState
from loop.permissions import SYSTEM
from loop.serialize import question_dict
from loop.tools.mail import message_id

from .chaos_sinks import HttpSink, SmtpSink


class Person:
    def __init__(self, *, web: HttpSink, smtp: SmtpSink | None = None) -> None:
        self.web, self.smtp = web, smtp
        self.asked: Counter[str] = Counter()
        self.answers: Counter[str] = Counter()
        self.moot = 0  # looks at a question the world had answered since (withdrawn soon)

    def delivered(self, step: Step, eid: str) -> bool:
        if step.tool == "email.send":
            assert self.smtp is not None
            return message_id(eid) in self.smtp.record.keys()
        return eid in self.web.record.keys()

    def expected_id(self, step: Step) -> str:
        """The id its effect has (or would have): digest of step, tool and resolved args."""
        outputs = dict(
            Step.objects.filter(task_id=step.task_id, state="done").values_list("key", "output")
        )
        return effect_id(step, step.tool, plans.resolve(step.args, outputs))

    def answer_questions(self) -> int:
        """Check and answer every blocked step; how many were answered."""
        answered = 0
        for blocked in Step.objects.filter(state=StepState.BLOCKED).order_by("pk"):
            effects = list(blocked.effects.order_by("created_at"))
            question = question_dict(blocked, effects)
            assert question is not None, f"{blocked} is blocked without a question"
            kind = question["kind"]
            self.asked[kind] += 1
            if kind == "did_it_happen":
                named = question["effects"]
                if not named:
                    # The world answered it since it was asked (a late report): the loop
                    # withdraws it at its next heartbeat (actions.withdraw_moot_questions).
                    self.asked[kind] -= 1
                    self.moot += 1
                    continue
                for effect in named:
                    assert effect["state"] == EffectState.UNCERTAIN, (blocked, effect)
                    assert Event.objects.filter(
                        effect_id=effect["id"], data__old="running", data__new="uncertain"
                    ).exists(), f"{blocked}: asked about {effect['id']}, which never ran"
                truth = {self.delivered(blocked, e["id"]) for e in named}
                assert len(truth) == 1, f"{blocked}: its effects disagree; one answer can't fit"
                decision = "happened" if truth.pop() else "rerun"
            else:
                assert not blocked.confirm_before, "these plans never ask before a first run"
                assert "nothing was sent" in blocked.question_text, blocked.question_text
                assert all(e.state == EffectState.PENDING for e in effects), effects
                assert not self.delivered(blocked, self.expected_id(blocked)), (
                    f"{blocked}: asked 'May I?' about a call that went out"
                )
                decision = "allow"
            self.answers[decision] += 1
            actions.unblock(step_id=blocked.pk, decision=decision, actor="test-person", user=SYSTEM)
            answered += 1
        return answered
