"""The model judge, Pippa (DESIGN.md §12): a model's turn at each tick decides what the step
does, whether it succeeded and what its output is; the loop makes that turn safe.

One tick of a model step:

    rebuild the step's conversation from its transcript (one conversation across attempts)
    → answer each call of the last reply left without a result (resume), before anything else
    → brief the model at the start of each attempt (the task, the plan with states and
      outputs, the step's instructions verbatim)
    → up to LOOP_LLM_MAX_TURNS requests: commit the reply, then run its calls in order, each
      result committed before the next call or request, until a reply ends the tick: with
      `commit_step` (its verdict), or with an accepted `add_steps` (`_revised`)

A side-effect call goes through the outbox with an effect id derived from the call itself (the
step, the tool, the canonical arguments: `effects.effect_id`), so the same call after a crash,
in a later turn or in a later attempt is the same effect: answered from its receipt (the model
is told it already happened, when, and what it answered), sent if it never was, or asked about
("Did this happen?") if it may have been. A second time only with a person's answer: a model
that makes the call again after being told asks "May I do this again?", and Dad's "allow"
makes it a new effect (`again`).

Who wrote the step decides whether each call asks first (DESIGN.md §5): a step no person wrote
asks "May I do this?" for every side-effect call; a person's step asks when `confirm_before`
(or LOOP_CONFIRM_SIDE_EFFECTS) says so, unless a schedule's standing authorization covers it.
Steps the model adds with `add_steps` are Pippa's: a proposal, approved by a person before
their side effects can run.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import DatabaseError, transaction

from .. import (
    actions,
    calls,
    conversation,
    effects,
    goals,
    journal,
    llm,
    plans,
    questions,
    tools,
    transcript,
    turns,
)
from ..models import (
    AuthorKind,
    Effect,
    EffectState,
    Event,
    EventKind,
    Step,
    Task,
    TranscriptEntry,
)
from ..outcomes import Busy, Done, Fenced, NotSent, Rejected, Uncertain
from ..permissions import Forbidden, Pippa
from .base import Verdict, Work
from .prompt import (
    ADD_STEPS,
    COMMIT,
    REMINDER,
    SAY,
    SYSTEM_TEXT,
    VERDICTS,
    Context,
    as_text,
    briefing,
    cut,
    model_name,
    offered,
    tool_specs,
)

log = logging.getLogger("loop.judge.model")

ADDED = "added steps: "  # an accepted add_steps call's result, then the keys
ALREADY = "not sent again: "  # a repeated call's result, answered from its effect's receipt


# ---- the judge -----------------------------------------------------------------------------


class ModelJudge:
    """Performs `judge: model` steps, one after another."""

    def plan_call(self, step: Step, holder: effects.Holder) -> effects.Request | None:
        return None  # the model decides its calls while it runs

    def perform(self, turn: Sequence[Work]) -> list[Verdict | Fenced]:
        """Each step's tick in turn; one that breaks is that step's retry, never its
        neighbours' loss (a failed write still ends the tick: DESIGN.md §11)."""
        verdicts: list[Verdict | Fenced] = []
        for work in turn:
            call = tools.Call.of(work.step, work.holder.owner, work.holder.epoch)
            try:
                with tools.calling(call):
                    verdicts.append(Tick(work.step, work.holder).run())
            except DatabaseError:
                raise
            except Exception as exc:
                log.exception("step '%s': the model judge failed", work.step.key)
                why = transcript.clean(f"{type(exc).__name__}: {exc}")[0]
                verdicts.append(Verdict.retry(f"step '{work.step.key}': {why}"))
        return verdicts


JUDGE = ModelJudge()


@dataclass
class Tick:
    step: Step
    holder: effects.Holder
    used_authorization: bool = False  # Dad's answer covers one call
    # The step's transcript as this tick read it, and every entry it wrote since.
    rows: list[TranscriptEntry] = field(default_factory=list)
    context: Context | None = None  # read at its first request
    # Results of read-only calls (and commit_step's) not committed yet: committed together
    # before the next request, the tick's end or any other write (`_flush`). A cut before
    # loses only them, and a read-only call runs again on resume.
    later: list[tuple[str, str]] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"step '{self.step.key}'"

    def run(self) -> Verdict | Fenced:
        step = self.step
        rows = self.rows = transcript.entries(step)  # kept whole by every write below
        if not rows:  # a new step: its system message and its briefing in one commit
            brief = briefing(step)
            with transaction.atomic(), journal.batched():
                self._add(transcript.Role.SYSTEM, SYSTEM_TEXT)
                self._add(transcript.Role.USER, brief)
        resumed = transcript.dangling(rows)
        for one in resumed:
            stop = self.answer(one.entry, one.index, one.call)
            if stop is not None:
                return stop
        self._flush()
        ended = self._committed(rows) if resumed else None
        if ended is not None:
            return ended  # the reply answered now ended the step
        if not any(r.role == transcript.Role.USER and r.attempt == step.attempts for r in rows):
            self._add(transcript.Role.USER, briefing(step))
        specs = tool_specs(step)
        for _ in range(int(settings.LOOP_LLM_MAX_TURNS)):
            spent = self._over_budget(rows)
            if spent is not None:
                return spent
            answer = llm.complete(self._request(rows), specs, on_retry=self._retrying)
            if isinstance(answer, llm.Unavailable):
                return self._given_back(answer.reason)
            if isinstance(answer, llm.Refused):
                return Verdict.retry(f"{self.where}: {answer.reason}")
            entry = transcript.add_reply(
                step,
                answer.content,
                _unique_ids([c.as_dict() for c in answer.tool_calls], rows),
                prompt_tokens=answer.prompt_tokens,
                completion_tokens=answer.completion_tokens,
                actor=self.holder.actor,
                rows=rows,
            )
            if not answer.tool_calls:
                reminded = any(
                    r.role == transcript.Role.USER
                    and r.attempt == step.attempts
                    and r.content == REMINDER
                    for r in rows
                )
                if reminded:
                    return Verdict.retry(f"{self.where}: the model stopped without commit_step")
                self._add(transcript.Role.USER, REMINDER)
                continue
            for index, one in enumerate(entry.tool_calls):
                stop = self.answer(entry, index, one)
                if stop is not None:
                    return stop
            self._flush()
            ended = self._committed(rows)
            if ended is not None:
                return ended
        return Verdict.retry(
            f"{self.where}: the model made {settings.LOOP_LLM_MAX_TURNS} requests "
            "(LOOP_LLM_MAX_TURNS) without commit_step"
        )

    def _add(self, role: str, content: str) -> None:
        self._flush()
        transcript.add(self.step, role, content, actor=self.actor, rows=self.rows)

    def _result(self, call_id: str, content: str, effect_id: str = "") -> None:
        """The call's result, in the step's transcript as this tick holds it (after the
        results held for later: the transcript keeps the calls' order)."""
        self._flush()
        transcript.add_result(
            self.step, call_id, content, effect_id, actor=self.actor, rows=self.rows
        )

    def _flush(self) -> None:
        """Commit the results held for later, in one transaction."""
        if self.later:
            transcript.add_results(self.step, self.later, actor=self.actor, rows=self.rows)
            self.later.clear()

    def _request(self, rows: list[TranscriptEntry]) -> list[dict[str, Any]]:
        """The step's transcript as chat messages, with what every request carries read anew
        (the conversation, Dad's answers: `prompt.Context`) after the system message: a
        message Dad writes while the step runs is in its next request."""
        messages = transcript.messages(rows)
        if self.context is None:
            self.context = Context(self.step)
        extra = self.context.text()
        if extra:
            at = 1 if messages and messages[0]["role"] == "system" else 0
            messages.insert(at, {"role": "system", "content": extra})
        return messages

    def _over_budget(self, rows: list[TranscriptEntry]) -> Verdict | None:
        """The step fails once its transcript's tokens (prompt and completion, as the
        endpoint counted them, over every attempt) reach LOOP_LLM_STEP_TOKENS."""
        budget = int(settings.LOOP_LLM_STEP_TOKENS)
        used = sum(transcript.tokens(rows).values())
        if used < budget:
            return None
        return Verdict.failed(
            f"{self.where}: the step used {used} tokens, its budget LOOP_LLM_STEP_TOKENS "
            f"({budget}): the model is asked no more"
        )

    def _given_back(self, reason: str) -> Verdict:
        """The endpoint is down: not the step's fault, so the attempt is given back and the
        worker parks; but a step given back LOOP_LLM_GIVE_BACKS times fails, with the reason."""
        given = Event.objects.filter(
            task_id=self.step.task_id,
            step_id=self.step.pk,
            kind=EventKind.STEP_RETRY,
            data__refund=True,
        ).count()
        limit = int(settings.LOOP_LLM_GIVE_BACKS)
        if given >= limit:
            return Verdict.failed(
                f"{self.where}: model endpoint down: {reason} (the attempt was given back "
                f"{given} times, LOOP_LLM_GIVE_BACKS)"
            )
        return Verdict.retry(
            f"{self.where}: model endpoint down: {reason}",
            delay=float(settings.LOOP_LLM_RETRY_SECONDS),
            refund=True,
        )

    def _retrying(self, reason: str, delay: float) -> None:
        log.warning("%s: model endpoint: %s; retrying in %.2fs", self.where, reason, delay)
        with transaction.atomic():
            journal.record(
                EventKind.MODEL_RETRY,
                step=self.step,
                actor=self.holder.actor,
                reason=reason,
                delay=delay,
            )

    # ---- a call and its result ---------------------------------------------------------

    def answer(
        self, entry: TranscriptEntry, index: int, call: dict[str, str]
    ) -> Verdict | Fenced | None:
        """Run the call and commit its result; a verdict or Fenced if the tick ends here with
        the call left without a result (a question for Dad, a busy or fenced effect)."""
        name = call.get("name", "")
        call_id = call.get("id", "")
        refused = call.get("refused")
        if refused:  # over a bound (llm.ToolCall): not run, its arguments not kept
            self._refuse(call_id, name, refused)
            return None
        if self._after_commit(entry, index):
            self._refuse(call_id, name, "not run: commit_step ended the step before this call")
            return None
        try:
            args = json.loads(call.get("arguments") or "{}")
        except ValueError as exc:
            self._refuse(call_id, name, f"the arguments are not JSON: {exc}")
            return None
        if not isinstance(args, dict):
            self._refuse(call_id, name, "the arguments must be a JSON object")
            return None
        problem = plans.check_value({"arguments": args}, "arguments", limit=None)
        if problem:  # a NUL, NaN, a number or a depth no database stores
            self._refuse(call_id, name, problem)
            return None
        if name == COMMIT:
            problem = _commit_problem(args)
            if problem:
                self._refuse(call_id, name, problem)
            else:
                self.later.append((call_id, f"committed: {args['verdict']}"))
            return None
        if name == ADD_STEPS:
            self._add_steps(call_id, args)
            return None
        if name == SAY:
            self._say(call_id, args)
            return None
        if name in (turns.PROPOSE, turns.PROPOSE_SCHEDULE) and turns.is_turn(self.step):
            self._propose(call_id, name, args)
            return None
        tool = offered(self.step).get(name)
        if tool is None:
            known = {model_name(n) for n in tools.names()}
            why = (
                f"the tool '{name}' is not offered to this step"
                if name in known
                else f"there is no tool '{name}'"
            )
            self._refuse(call_id, name, f"{why}: nothing was run")
            return None
        problems = tool.check_args(args, self.where)
        if problems:
            self._refuse(call_id, name, "; ".join(problems))
            return None
        if not tool.side_effect:
            self.later.append((call_id, cut(self._read(tool, args))))
            return None
        edited = transcript.edit_of(self.step, call_id)  # Dad's "Edit, then allow"
        return self._side_effect(entry, index, call_id, tool, args if edited is None else edited)

    def _read(self, tool: tools.Tool, args: dict[str, Any]) -> str:
        try:
            return as_text(tool.run(args))
        except DatabaseError:
            raise
        except Exception as exc:  # the model reads the error and decides
            return f"error: {type(exc).__name__}: {exc}"

    def _side_effect(
        self,
        entry: TranscriptEntry,
        index: int,
        call_id: str,
        tool: tools.Tool,
        args: dict[str, Any],
    ) -> Verdict | Fenced | None:
        self._flush()  # what was read before is in the transcript before anything is sent
        step = self.step
        latest = effects.latest_of_call(step, tool.name, args)
        again = latest.again if latest is not None else 0
        allowed = False  # this start's authorization, used for this call
        if latest is not None and latest.state in (EffectState.SUCCEEDED, EffectState.FAILED):
            answered = self._results_of(latest)
            if not answered:
                pass  # this call's own effect, answered before its result was written: a cut
            elif allowed := self._authorized(tool.name, args):
                again += 1  # Dad allowed this exact call once more: a new effect
            elif any(text.startswith(ALREADY) for text in answered):
                return self._ask(tool, args, again=latest)  # told, and made again: ask Dad
            else:
                self._result(call_id, cut(_already(latest)), latest.pk)
                return None
        unsent = latest is None or latest.state == EffectState.PENDING or again > latest.again
        covered = allowed or (unsent and self._authorized(tool.name, args))
        if unsent and self._asks(tool) and not covered and not self._standing():
            return self._ask(tool, args)
        request = effects.Request(self.holder, step, tool, args, again=again, covered=covered)
        [outcome] = effects.send_all([request])
        key = request.effect_id
        if isinstance(outcome, Done):
            self._result(call_id, cut(_done_text(outcome, key)), key)
        elif isinstance(outcome, Rejected):
            text = f"error: {outcome.error}"
            self._result(call_id, text, key)
        elif isinstance(outcome, NotSent):
            text = f"error: not sent: {outcome.error} (try again later)"
            self._result(call_id, text, key)
        elif isinstance(outcome, Uncertain):
            return Verdict.blocked(f"{self.where}: may have happened: {outcome}")
        elif isinstance(outcome, Busy):
            return Verdict.retry(f"{self.where}: effect busy until {outcome.until}")
        else:
            return outcome  # Fenced: the lease moved on; its new holder goes on
        return None

    @property
    def actor(self) -> str:
        return self.holder.actor

    def _asks(self, tool: tools.Tool) -> bool:
        """Whether a side-effect call of this step asks "May I do this?" before it is sent: a
        step no person wrote always does (the floor); a person's step when `confirm_before`
        (or LOOP_CONFIRM_SIDE_EFFECTS) says so."""
        step = self.step
        return step.confirm_before or settings.LOOP_CONFIRM_SIDE_EFFECTS or goals.unasked(step)

    def _standing(self) -> bool:
        """A schedule's standing authorization covers this step's calls (DESIGN.md §10): the
        step is its template's, and its run's message is still the latest. Journaled."""
        task = Task.objects.only("origin_message_id", "origin_run_id").get(pk=self.step.task_id)
        if goals.unasked(self.step) or not conversation.standing(task, self.step):
            return False
        with transaction.atomic():
            journal.record(
                EventKind.SIDE_EFFECT_AUTO_CONFIRMED,
                step=self.step,
                actor=self.actor,
                run=task.origin_run_id,
                message=task.origin_message_id,
                rule="confirm_before",
            )
        return True

    def _ask(self, tool: tools.Tool, args: dict[str, Any], again: Effect | None = None) -> Verdict:
        """Block on "May I do this?" about this call (`again`: the effect of the same call that
        already happened, whose receipt the question shows)."""
        target, summary = tool.summary(args)
        kind, text = questions.may_i(tool.name, target, summary, unsent=False)
        if again is not None:
            text = text.replace("May I do this?", "May I do this again?", 1)
            text += "\n" + questions.already_line(again)
        return Verdict.blocked(
            f"{self.where}: waits for Dad's answer about {tool.name}", ask=(kind, text)
        )

    def _results_of(self, effect: Effect) -> list[str]:
        """The results in this step's transcript that name `effect` (the call's own, then any
        repeat's)."""
        return list(
            TranscriptEntry.objects.filter(
                step_id=self.step.pk, role=TranscriptEntry.Role.TOOL, effect_id=effect.pk
            ).values_list("content", flat=True)
        )

    def _authorized(self, tool_name: str, args: dict[str, Any]) -> bool:
        """Whether this attempt's start consumed Dad's authorization of exactly this call
        (journaled in the start's commit, after the start), not yet used in this tick."""
        if self.used_authorization:
            return False
        mine = Event.objects.filter(task_id=self.step.task_id, step_id=self.step.pk)
        start = (
            mine.filter(kind__in=[EventKind.STEP_STARTED, EventKind.STEP_RESTARTED])
            .order_by("-id")
            .values_list("id", flat=True)
            .first()
        )
        found = mine.filter(
            kind=EventKind.AUTHORIZATION_CONSUMED,
            id__gt=start or 0,
            data__call=calls.digest(tool_name, args),
        ).exists()
        self.used_authorization = found
        return found

    def _add_steps(self, call_id: str, args: dict[str, Any]) -> None:
        """Through the same action as everyone else; the steps and the call's result commit
        together, so a resume never adds them twice."""
        step = self.step
        try:
            with transaction.atomic():
                added = actions.add_steps(
                    task_id=step.task_id,
                    steps=args.get("steps"),
                    after=args.get("after"),
                    actor=self.holder.actor,
                    user=Pippa(step.task_id, step.key, step.attempts),
                )
                keys = ", ".join(s.key for s in added)
                self._result(call_id, ADDED + keys)
        except (plans.PlanError, actions.Refused, Forbidden) as exc:
            self._refuse(call_id, ADD_STEPS, f"refused: {exc}")

    def _say(self, call_id: str, args: dict[str, Any]) -> None:
        """Pippa writes in the conversation (DESIGN.md §10): the message and the call's result
        commit together, so a resume never posts it twice. Bounded by LOOP_SAY_CHARS."""
        text = args.get("text")
        limit = int(settings.LOOP_SAY_CHARS)
        extra = sorted(set(args) - {"text"})
        if extra:
            self._refuse(call_id, SAY, f"say takes no argument '{extra[0]}'")
            return
        if not isinstance(text, str) or not text.strip():
            self._refuse(call_id, SAY, "say: 'text' is required, a non-empty string")
            return
        if len(text) > limit:
            self._refuse(
                call_id,
                SAY,
                f"say: 'text' is {len(text)} characters, at most {limit} (LOOP_SAY_CHARS)",
            )
            return
        step = self.step
        with transaction.atomic():
            message = conversation.post(
                author="Pippa",
                kind=AuthorKind.PIPPA,
                text=text,
                user=Pippa(step.task_id, step.key, step.attempts),
                task_id=step.task_id,
            )
            self._result(call_id, f"said (message {message.pk})")

    def _propose(self, call_id: str, name: str, args: dict[str, Any]) -> None:
        """A conversation turn's proposal of a task or a schedule (`turns.propose`,
        `turns.propose_schedule`): it and the call's result commit together, so a resume never
        proposes it twice."""
        try:
            with transaction.atomic():
                if name == turns.PROPOSE:
                    task = turns.propose(self.step, args)
                    said = f"proposed as task {task.pk}: it waits for Dad's approval"
                else:
                    message = turns.propose_schedule(self.step, args)
                    said = f"proposed in message {message.pk}: it waits for Dad's approval"
                self._result(call_id, said)
        except (plans.PlanError, actions.Refused, Forbidden) as exc:
            self._refuse(call_id, name, f"refused: {exc}")

    def _refuse(self, call_id: str, name: str, why: str) -> None:
        with transaction.atomic():
            journal.record(
                EventKind.MODEL_CALL_REFUSED,
                step=self.step,
                actor=self.holder.actor,
                tool=name,
                why=why,
            )
            self._result(call_id, f"error: {why}")

    def _after_commit(self, entry: TranscriptEntry, index: int) -> bool:
        """Whether an earlier call of this reply was a valid commit_step."""
        for earlier in (entry.tool_calls or [])[:index]:
            if earlier.get("name") == COMMIT and _commit_args(earlier) is not None:
                return True
        return False

    def _committed(self, rows: list[TranscriptEntry]) -> Verdict | None:
        """The verdict of the last reply's commit_step, once each of its calls has a result."""
        if transcript.dangling(rows):
            return None
        replies = [r for r in rows if r.role == transcript.Role.ASSISTANT]
        if not replies or any(r.seq > replies[-1].seq and r.role == "user" for r in rows):
            return None
        for call in replies[-1].tool_calls or []:
            args = _commit_args(call) if call.get("name") == COMMIT else None
            if args is not None:
                return _verdict(self.where, args)
        return self._revised(replies[-1], rows)

    def _revised(self, reply: TranscriptEntry, rows: list[TranscriptEntry]) -> Verdict | None:
        """`add_steps` ends the tick too (DESIGN.md §12), when the plan took the steps and the
        reply did not commit: a planning step is then done, its output the steps it wrote; any
        other step goes on in its next attempt, whose briefing shows the revised plan."""
        asked = {c.get("id") for c in reply.tool_calls or [] if c.get("name") == ADD_STEPS}
        added = [
            key.strip()
            for r in rows
            if r.role == transcript.Role.TOOL
            and r.tool_call_id in asked
            and r.content.startswith(ADDED)
            for key in r.content[len(ADDED) :].split(",")
        ]
        if not added:
            return None
        task = Task.objects.only("state").get(pk=self.step.task_id)
        if self.step.key == goals.PLAN_KEY and goals.planning(task):
            return Verdict.done({"steps": added})
        return Verdict.retry(
            f"{self.where}: the plan was revised (added {', '.join(added)}); the step goes on "
            "with the revised plan",
            delay=0,
        )


def _unique_ids(found: list[dict[str, str]], rows: list[TranscriptEntry]) -> list[dict[str, str]]:
    """The reply's calls, each with an id no other call of the step has (a model may repeat
    or leave out ids): a result must name exactly one call."""
    seen = {c.get("id") for r in rows for c in r.tool_calls or []}
    for n, one in enumerate(found):
        if not one["id"] or one["id"] in seen:
            one["id"] = f"{one['id'] or 'call'}~{len(rows)}.{n}"
        seen.add(one["id"])
    return found


def _commit_args(call: dict[str, str]) -> dict[str, Any] | None:
    try:
        args = json.loads(call.get("arguments") or "{}")
    except ValueError:
        return None
    if not isinstance(args, dict) or _commit_problem(args):
        return None
    return args


def _commit_problem(args: dict[str, Any]) -> str:
    verdict = args.get("verdict")
    if verdict not in VERDICTS:
        return f"commit_step: 'verdict' must be one of {', '.join(VERDICTS)}"
    extra = sorted(set(args) - {"verdict", "output", "error", "question"})
    if extra:
        return f"commit_step takes no argument '{extra[0]}'"
    for name in ("error", "question"):
        if name in args and not isinstance(args[name], str):
            return f"commit_step: '{name}' must be a string"
    if verdict == "blocked" and not args.get("question"):
        return "commit_step: a 'blocked' verdict needs a 'question' for Dad"
    problem = plans.check_value(args, "arguments")  # what the verdict stores, output and texts
    if problem:
        return f"commit_step: {problem}"
    return ""


def _verdict(where: str, args: dict[str, Any]) -> Verdict:
    kind = args["verdict"]
    error = args.get("error") or ""
    if kind == "done":
        return Verdict.done(args.get("output"))
    if kind == "failed":
        return Verdict.failed(f"{where}: {error or 'the model said the step failed'}")
    if kind == "retry":
        return Verdict.retry(f"{where}: {error or 'the model asked to try again'}")
    question = str(args.get("question"))
    return Verdict.blocked(
        f"{where}: {question}", ask=("may_i", f"May I go on?\nPippa asks: {question}")
    )


def _already(effect: Effect) -> str:
    """A repeated call's result: it is not sent again; when it happened and what it answered
    (or why it was refused), and the one way to a second."""
    at = effect.updated_at.strftime("%Y-%m-%d %H:%M:%S UTC")
    if effect.state == EffectState.FAILED:
        said = f"it was tried at {at} and refused: {effect.error}"
    else:
        said = f"this exact call already happened at {at}; its receipt: {as_text(effect.response)}"
    return (
        f"{ALREADY}{said}. If it really must happen once more, make the same call again: Dad "
        "will be asked."
    )


def _done_text(outcome: Done, effect_id: str) -> str:
    """A side-effect call's result as the model reads it: its response, or how it is known
    to have happened when a person or a probe settled it."""
    response = outcome.response
    if "settled_by" in response:
        note = response.get("note") or ""
        return f"it happened (Dad, {response['settled_by']}, said so{': ' + note if note else ''})"
    effect = Effect.objects.filter(pk=effect_id).only("evidence").first()
    if outcome.receipt and effect is not None and effect.evidence:
        return f"it happened (checked: {effect.evidence}): {as_text(response)}"
    return as_text(response)
