"""Every change of state that people and agents ask for, and the task rules they share with
the runner. Views, the API, the admin and commands call these; none writes a state field.

Each `do_*`-style action checks who asks (`user`: a person, an agent's user, or
`permissions.SYSTEM`; see `loop/permissions.py`), validates, then changes state and journals in
one transaction.
"""

from __future__ import annotations

from typing import Any, Literal

from django.db import transaction
from django.db.models import F, Max
from django.utils import timezone

from . import (
    calls,
    goals,
    journal,
    open_steps,
    permissions,
    plans,
    questions,
    sql,
    tools,
    transcript,
)
from .models import (
    AgentToken,
    EffectState,
    EventKind,
    Origin,
    QuestionKind,
    ScheduleRun,
    Step,
    StepState,
    Task,
    TaskState,
    Writer,
)
from .permissions import Who, require
from .states import IllegalTransition
from .transitions import move_effect, move_step, move_task

DECISIONS = {
    "allow": QuestionKind.MAY_I,
    "deny": QuestionKind.MAY_I,
    "happened": QuestionKind.DID_IT_HAPPEN,
    "rerun": QuestionKind.DID_IT_HAPPEN,
    "fail": QuestionKind.DID_IT_HAPPEN,
}


class Refused(Exception):
    """The request does not fit the current state; nothing was changed."""


# ---- the task rules, shared by every caller --------------------------------------------------


def follow(
    task: Task,
    *,
    actor: str,
    current: Step | None | Literal["unread"] = "unread",
    let_go: bool = False,
) -> None:
    """Move the task to match its steps: blocked while its current step is blocked, back to
    running when it is not, done or failed when nothing runnable remains; a task Pippa plans
    as its planning step says (`_follow_plan`). In a transaction. `current`: the task's first
    open step (or None), if the caller read it in this transaction; `let_go`: the caller's
    lease of the task is given up in the statement that ends it (a worker at a task's end)."""
    if task.ended:
        return
    if goals.planning(task):
        _follow_plan(task, actor=actor)
        return
    if current == "unread":
        # Through the partial indexes step_open and step_failed: never the task's done steps.
        current = open_steps.first_open([task.pk]).get(task.pk)
    if current is None:
        settled = not open_steps.has_unwaived_failure(task.pk)
        fields: dict[str, Any] = {"run_after": None}
        if let_go:
            fields |= {"lease_owner": None, "lease_until": None}
        move_task(task, "finish" if settled else "fail", actor=actor, fields=fields)
    elif current.state == StepState.BLOCKED:
        if task.state == TaskState.RUNNING:
            move_task(task, "block", actor=actor)
    elif task.state == TaskState.BLOCKED:
        move_task(task, "unblock", actor=actor)


def _follow_plan(task: Task, *, actor: str) -> None:
    """A task Pippa plans, after its planning step moved: blocked while the step asks Dad,
    planning again once he answered; when the step is done, failed without a plan, waiting for
    Dad's approval (LOOP_CONFIRM_PLANS), or running; failed when the step failed."""
    state = task.steps.filter(key=goals.PLAN_KEY).values_list("state", flat=True).first()
    if state == StepState.BLOCKED:
        if task.state == TaskState.PLANNING:
            move_task(task, "block", actor=actor)
        return
    if task.state == TaskState.BLOCKED:
        move_task(task, "replan", actor=actor)
    if state in (StepState.PENDING, StepState.RUNNING):
        return
    if state != StepState.DONE:
        move_task(task, "fail", actor=actor, data={"reason": "the planning step failed"})
    elif not task.steps.exclude(key=goals.PLAN_KEY).exists():
        move_task(task, "fail", actor=actor, data={"reason": goals.NO_PLAN})
    elif Step.objects.filter(task_id=task.pk, proposed=True).exists():
        move_task(task, "propose", actor=actor, data={"reason": goals.WAITING})
    else:
        move_task(task, "start", actor=actor, data={"reason": "planned"})


def after_step_failed(task: Task, *, actor: str) -> None:
    """A failed step pauses its task while other steps remain (waiting for a replacement or a
    resume); with nothing runnable left the task fails. A failed planning step fails its
    task, whatever steps it added (`_follow_plan`)."""
    remaining = bool(open_steps.first_open([task.pk]))
    if goals.planning(task):
        follow(task, actor=actor)
    elif remaining and task.state in (TaskState.RUNNING, TaskState.BLOCKED):
        move_task(task, "pause", actor=actor, data={"reason": "a step failed"})
    else:
        follow(task, actor=actor)


def cancel_unsettled(step: Step, *, actor: str) -> None:
    for effect in step.effects.filter(
        state__in=[EffectState.PENDING, EffectState.UNCERTAIN]
    ).select_for_update():
        move_effect(effect, "cancel", actor=actor)


# ---- creating and changing plans -------------------------------------------------------------


def create_task(
    *,
    plan: plans.PlanSpec,
    actor: str,
    user: Who,
    origin: Origin = Origin.PLAN,
    run: ScheduleRun | None = None,
) -> Task:
    """A task in `planning` with its steps, then `running`: one commit. A schedule's `run`
    gives the task its origin message (the run's `[SCHEDULED TASK]` message), and its steps
    are the schedule's template, as Dad wrote it. A plan by Pippa or an agent that needs a
    person's approval (`goals.needs_approval`) waits for it, paused, instead of running."""
    require(user, "create a task", actor=actor)
    return _create(plan, actor, user, origin=origin, run=run)


def propose_task(*, plan: plans.PlanSpec, actor: str, user: Who) -> Task:
    """A task proposed by Pippa (in a conversation turn, her own task's) or an agent: every
    step `proposed`, the task paused until a person approves or declines it, whatever
    LOOP_CONFIRM_PLANS says (a proposal is a question to Dad)."""
    task_id = user.task_id if isinstance(user, permissions.Pippa) else None
    require(user, "propose a task", actor=actor, task_id=task_id)
    return _create(plan, actor, user, origin=Origin.CONVERSATION, propose=True)


def create_task_from_goal(
    *, goal: Any, title: Any = None, actor: str, user: Who, origin: Origin = Origin.PLAN
) -> Task:
    """A task Pippa plans (DESIGN.md §12): created in `planning`, with the goal as its
    instructions and one step, the planning step (`goals.plan_for`), which a worker's claim
    takes like a running task's next step; it writes the plan with add_steps (as Pippa: a
    proposal, DESIGN.md §5). PlanError naming `goal` or `title`, or LOOP_LLM_BASE_URL without
    a model; nothing is created then."""
    require(user, "create a task", actor=actor)
    return _create(goals.plan_for(goal, title=title), actor, user, origin=origin, start=False)


def _create(
    plan: plans.PlanSpec,
    actor: str,
    user: Who,
    *,
    origin: Origin = Origin.PLAN,
    run: ScheduleRun | None = None,
    start: bool = True,
    propose: bool = False,
) -> Task:
    writer, written_by = permissions.author(user, actor)
    if run is not None:
        writer, written_by = Writer.SCHEDULE, run.schedule.name
    waits = start and (propose or goals.needs_approval(writer, plan.steps))
    with transaction.atomic():
        task = Task.objects.create(
            title=plan.title,
            instructions=plan.instructions,
            created_by=actor,
            origin=origin,
            origin_run=run,
            origin_message_id=run.message_id if run else None,
            driver=written_by if writer == Writer.AGENT else "",
        )
        planned: dict[str, Any] = {} if start else {"goal": plan.instructions}
        journal.record(
            EventKind.TASK_CREATED,
            task=task,
            actor=actor,
            title=plan.title,
            origin=origin,
            **planned,
        )
        _insert_steps(task, plan.steps, at=0, actor=actor, by=(writer, written_by), proposed=waits)
        if waits:
            move_task(task, "propose", actor=actor, data={"reason": goals.WAITING})
        elif start:
            move_task(task, "start", actor=actor)
    return task


def _insert_steps(
    task: Task,
    specs: list[plans.StepSpec],
    *,
    at: int,
    actor: str,
    by: tuple[Writer, str],
    proposed: bool = False,
) -> list[Step]:
    """The steps, written by `by` (writer, name) and `proposed` or not, in multi-row INSERTs of
    `sql.ROWS_AT_ONCE` rows, their ids read back with one statement by (task, position)
    (index step_position_unique): a 10,000-step plan is 21 statements, not 10,000."""
    writer, written_by = by
    created = [
        Step(
            task=task,
            position=at + index,
            key=spec.key,
            title=spec.title,
            tool=spec.tool,
            args=spec.args,
            side_effect=spec.side_effect,
            confirm_before=spec.confirm_before,
            max_attempts=spec.max_attempts,
            judge=spec.judge,
            instructions=spec.instructions,
            tools=list(spec.tools),
            writer=writer,
            written_by=written_by[:200],
            proposed=proposed,
        )
        for index, spec in enumerate(specs)
    ]
    sql.insert_all(Step, created)
    ids = dict(
        Step.objects.filter(
            task=task, position__gte=at, position__lt=at + len(created)
        ).values_list("position", "pk")
    )
    for step in created:
        step.pk = ids[step.position]
    journal.record(
        EventKind.STEPS_ADDED,
        task=task,
        actor=actor,
        keys=[s.key for s in created],
        at=at,
        written_by={"kind": writer, "name": written_by},
        proposed=proposed,
    )
    return created


def add_steps(
    *, task_id: int, steps: Any, after: str | None = None, actor: str, user: Who
) -> list[Step]:
    """Add steps after the step with key `after` (default: at the end). Only pending steps
    move. A task paused by a failed step takes the new steps as its replacement and runs on.
    Steps from Pippa or an agent that need a person's approval (`goals.needs_approval`) are a
    proposal: the task waits for it, paused (a goal's plan, once its planning step is done)."""
    require(user, "add steps", actor=actor, task_id=task_id)
    by = permissions.author(user, actor)
    with transaction.atomic():
        task = Task.objects.select_for_update().get(pk=task_id)
        if task.ended:
            raise Refused(f"can't add steps when the task is {task.state}")
        # Only what the checks need (a big plan's outputs and args stay on disk).
        existing = list(task.steps.order_by("position").values_list("key", "position", "state"))
        keys = frozenset(key for key, _, _ in existing)
        if after is None:
            at = (existing[-1][1] + 1) if existing else 0
            earlier = keys
        else:
            anchor = next((position for key, position, _ in existing if key == after), None)
            if anchor is None:
                raise plans.PlanError([f"after: no step '{after}' in this task"])
            at = anchor + 1
            if any(state != StepState.PENDING for _, position, state in existing if position >= at):
                raise Refused(f"after: steps after '{after}' have already started")
            earlier = frozenset(key for key, position, _ in existing if position < at)
        specs = plans.validate_steps(steps, earlier=earlier)
        clash = sorted(keys & {s.key for s in specs})
        if clash:
            raise plans.PlanError([f"step '{k}': key is already in this task" for k in clash])
        waits = goals.needs_approval(by[0], specs)
        _shift(task, at, len(specs))
        created = _insert_steps(task, specs, at=at, actor=actor, by=by, proposed=waits)
        if waits:
            if task.state in (TaskState.RUNNING, TaskState.BLOCKED) and not goals.planning(task):
                move_task(task, "pause", actor=actor, data={"reason": goals.CHANGED})
        elif task.state == TaskState.PAUSED and not goals.waits_for_approval(task):
            if _waive_failed(task, actor=actor):
                move_task(task, "resume", actor=actor, data={"reason": "replacement steps added"})
        elif task.state != TaskState.PAUSED:
            follow(task, actor=actor)
    return created


def _shift(task: Task, at: int, count: int) -> None:
    """Make room at `at` with two statements: the later steps first past the end (the unique
    constraint on (task, position) holds after every row's update, since every new value is
    above every old one), then down into place, `count` later than they were."""
    top = task.steps.aggregate(top=Max("position"))["top"]
    if top is None or top < at:
        return
    later = task.steps.filter(position__gte=at)
    later.update(position=F("position") + top + 1 + count)
    later.update(position=F("position") - top - 1)


def _waive_failed(task: Task, *, actor: str) -> bool:
    failed = list(task.steps.filter(state=StepState.FAILED, waived=False))
    for step in failed:
        Step.objects.filter(pk=step.pk).update(waived=True)
        journal.record(EventKind.STEP_EDITED, step=step, actor=actor, waived=True)
    return bool(failed)


def pause(*, task_id: int, actor: str, user: Who) -> Task:
    """Pause a running or blocked task; not one Pippa is planning (its plan is not written)."""
    require(user, "pause", actor=actor, task_id=task_id)
    with transaction.atomic():
        task = Task.objects.select_for_update().get(pk=task_id)
        if goals.planning(task):
            raise Refused(
                f"can't pause task {task.pk} while Pippa plans it: answer its question, "
                "or supersede it"
            )
        _move(task, "pause", actor)
    return task


def resume(*, task_id: int, actor: str, user: Who) -> Task:
    """Resume a paused task; a failed step that paused it is skipped from now on. A plan
    waiting for approval is approved (`approve_plan`), not resumed."""
    require(user, "resume", actor=actor, task_id=task_id)
    with transaction.atomic():
        task = Task.objects.select_for_update().get(pk=task_id)
        if goals.waits_for_approval(task):
            raise Refused(f"task {task.pk} is {goals.WAITING}: approve the plan instead")
        _move(task, "resume", actor)
        _waive_failed(task, actor=actor)
        follow(task, actor=actor)
    return task


def approve_plan(*, task_id: int, actor: str, user: Who) -> Task:
    """A person's one click on a proposal by Pippa or an agent (DESIGN.md §5): its steps are
    approved, and each side-effect call among them whose arguments are known in full is
    authorized exactly as the card showed it (its digest, `loop.calls`; an edit after this
    clears it); one whose arguments wait for an earlier step's output asks "May I do this?"
    when it runs, with them filled in. The task runs on (a failed step the proposal replaces
    is waived). Journaled `plan_approved` with the calls it covers. Refused unless the task
    waits for an approval."""
    require(user, "approve a plan", actor=actor, task_id=task_id)
    with transaction.atomic():
        task = Task.objects.select_for_update().get(pk=task_id)
        if not goals.waits_for_approval(task):
            raise Refused(f"task {task.pk} is {task.state}: no plan of it waits for approval")
        steps = goals.proposal(task)
        authorized = {}
        for step in steps:
            fields: dict[str, Any] = {"proposed": False}
            if step.side_effect and step.judge == "tool" and not plans.references(step.args):
                fields |= {"authorized_by": actor, "authorized_call": calls.of(step)}
                authorized[step.key] = fields["authorized_call"]
            Step.objects.filter(pk=step.pk, proposed=True).update(**fields)
        journal.record(
            EventKind.PLAN_APPROVED,
            task=task,
            actor=actor,
            keys=[s.key for s in steps],
            calls=authorized,
        )
        _move(task, "resume", actor, reason=goals.APPROVED)
        _waive_failed(task, actor=actor)
        follow(task, actor=actor)
    return task


def decline_plan(*, task_id: int, actor: str, user: Who, note: str = "") -> Task:
    """A person declines a proposal: its steps fail (waived: the task does not fail for them),
    journaled `plan_declined`. A goal's plan declined fails its task; any other task runs on
    without them, unless a failed step still waits for a replacement."""
    require(user, "approve a plan", actor=actor, task_id=task_id)
    with transaction.atomic():
        task = Task.objects.select_for_update().get(pk=task_id)
        if not goals.waits_for_approval(task):
            raise Refused(f"task {task.pk} is {task.state}: no plan of it waits for approval")
        steps = goals.proposal(task)
        error = f"declined by {actor}" + (f": {note}" if note else "")
        for step in steps:
            move_step(
                step,
                "decline",
                kind=EventKind.STEP_FAILED,
                actor=actor,
                fields={"error": error, "finished_at": timezone.now(), "proposed": False},
            )
            Step.objects.filter(pk=step.pk).update(waived=True)
        journal.record(
            EventKind.PLAN_DECLINED, task=task, actor=actor, keys=[s.key for s in steps], note=note
        )
        if goals.came_from_planning(task):
            _move(task, "fail", actor, reason=goals.DECLINED)
        elif not open_steps.has_unwaived_failure(task.pk):
            _move(task, "resume", actor, reason=goals.DECLINED)
            follow(task, actor=actor)
    return task


def give(*, task_id: int, agent: str, actor: str, user: Who) -> Task:
    """A person lets the agent `agent` drive the task over the API ("" takes it back)."""
    require(user, "give a task", actor=actor, task_id=task_id)
    if agent and not AgentToken.objects.filter(name=agent, revoked=False).exists():
        raise Refused(f"agent: no live agent token named '{agent}'")
    with transaction.atomic():
        task = Task.objects.select_for_update().get(pk=task_id)
        Task.objects.filter(pk=task.pk).update(driver=agent)
        task.driver = agent
        journal.record(EventKind.TASK_GIVEN, task=task, actor=actor, agent=agent)
    return task


def supersede(
    *, task_id: int, plan: plans.PlanSpec, actor: str, user: Who, origin: Origin = Origin.PLAN
) -> Task:
    """Replace a task by a successor created from `plan` (where the plan came from: `origin`);
    the old task's pending steps never run."""
    require(user, "supersede", actor=actor, task_id=task_id)
    with transaction.atomic():
        task = Task.objects.select_for_update().get(pk=task_id)
        if task.ended:
            raise Refused(f"can't supersede when the task is {task.state}")
        successor = _create(plan, actor, user, origin=origin)
        _move(task, "supersede", actor, fields={"successor": successor}, successor=successor.pk)
    return successor


def _move(
    task: Task, event: str, actor: str, fields: dict[str, Any] | None = None, **data: Any
) -> None:
    try:
        move_task(task, event, actor=actor, fields=fields, data=data)
    except IllegalTransition as exc:
        raise Refused(str(exc)) from None


# ---- recovering from a failed step -------------------------------------------------------------


def _failed_step(step_id: int) -> tuple[Task, Step]:
    """The task (locked first) and its failed step, not yet waived or replaced; Refused
    otherwise, or when the task has ended (its steps never run again)."""
    task_id = Step.objects.values_list("task_id", flat=True).get(pk=step_id)
    task = Task.objects.select_for_update().get(pk=task_id)
    step = Step.objects.select_for_update().get(pk=step_id)
    if step.state != StepState.FAILED or step.waived:
        shown = "skipped or replaced" if step.waived else step.state
        raise Refused(f"step '{step.key}' is {shown}, not failed")
    if task.ended:
        raise Refused(f"task {task.pk} is {task.state}: its steps never run again")
    if goals.planning(task) or goals.waits_for_approval(task):
        raise Refused(f"task {task.pk} waits for a plan: approve or decline it first")
    return task, step


def breaks_if_skipped(step: Step) -> list[Step]:
    """The steps still to run whose arguments use the step's output: skipping it, they fail."""
    later = Step.objects.filter(task_id=step.task_id, position__gt=step.position).exclude(
        state__in=[StepState.DONE, StepState.FAILED]
    )
    return [s for s in later.order_by("position") if step.key in plans.references(s.args)]


def _run_on(task: Task, *, actor: str, reason: str) -> None:
    """A task paused by a failed step runs on once no failed step counts against it."""
    if task.state == TaskState.PAUSED and not open_steps.has_unwaived_failure(task.pk):
        _move(task, "resume", actor, reason=reason)
    follow(task, actor=actor)


def retry_step(*, step_id: int, actor: str, user: Who) -> Step:
    """A failed step again: a replacement right after it, the same call written by the same
    writer (so the guard asks exactly what it asked of the original; an answer given to the
    original does not carry over) with a fresh attempt cap. The failed step keeps its
    history under the key `KEY.failed-N`, and the replacement takes its key, so the steps
    that use its output find it. Journaled `step_edited` (the renaming, waived) and
    `steps_added` (the replacement, `retry_of`); the task runs on. Returns the replacement."""
    require(user, "retry a step", actor=actor, step_id=step_id)
    with transaction.atomic():
        task, step = _failed_step(step_id)
        taken = set(task.steps.values_list("key", flat=True))
        n = 1
        while f"{step.key[:88]}.failed-{n}" in taken:
            n += 1
        old_key = f"{step.key[:88]}.failed-{n}"
        Step.objects.filter(pk=step.pk).update(key=old_key, waived=True)
        journal.record(
            EventKind.STEP_EDITED, step=step, actor=actor, waived=True, key=old_key, retried=True
        )
        _shift(task, step.position + 1, 1)
        replacement = Step.objects.create(
            task=task,
            position=step.position + 1,
            key=step.key,
            title=step.title,
            tool=step.tool,
            args=step.args,
            side_effect=step.side_effect,
            confirm_before=step.confirm_before,
            max_attempts=step.max_attempts,
            judge=step.judge,
            instructions=step.instructions,
            tools=step.tools,
            writer=step.writer,
            written_by=step.written_by,
        )
        journal.record(
            EventKind.STEPS_ADDED,
            task=task,
            actor=actor,
            keys=[replacement.key],
            at=replacement.position,
            written_by={"kind": step.writer, "name": step.written_by},
            proposed=False,
            retry_of=step.pk,
        )
        _run_on(task, actor=actor, reason=f"step '{step.key}' retried")
    return replacement


def skip_step(*, step_id: int, actor: str, user: Who) -> Step:
    """A failed step waived: the task runs on without its output (the steps that use it,
    `breaks_if_skipped`, fail when they run). Journaled `step_edited` (waived, skipped)."""
    require(user, "skip a step", actor=actor, step_id=step_id)
    with transaction.atomic():
        task, step = _failed_step(step_id)
        Step.objects.filter(pk=step.pk).update(waived=True)
        journal.record(EventKind.STEP_EDITED, step=step, actor=actor, waived=True, skipped=True)
        _run_on(task, actor=actor, reason=f"step '{step.key}' skipped")
    return step


# ---- answers to questions ----------------------------------------------------------------------


def unblock(
    *,
    step_id: int,
    decision: str,
    actor: str,
    user: Who,
    note: str = "",
    args: dict[str, Any] | None = None,
) -> Step:
    """Answer a blocked step's question (DESIGN.md §5, §17). A decision that does not answer
    the question changes nothing. Answers that talk back:

    - `allow` with `args` (edit, then allow): the call's arguments as Dad changed them,
      validated as the tool's; the step's call becomes the edited one (journaled with both)
      and the authorization binds it;
    - `deny` with a `note` (the reason): a model step's call gets the reason as its result and
      Pippa goes on; a tool step fails with it and its task waits, paused, for a replacement or
      a resume: a denial never fails a task outright;
    - `reply` with a `note`: words to Pippa about the question, no decision. A model step's
      call that asks "May I do this?" gets them as its result (it was not made; she may make
      it again, and Dad is asked again); any other question keeps waiting for its answer, the
      words journaled (a model step's next requests carry them).
    """
    if decision not in DECISIONS and decision != REPLY:
        raise Refused(f"decision: must be one of {', '.join([*DECISIONS, REPLY])}")
    problems = []  # the request's own faults (a 400 naming the field), before any state
    if args is not None and decision != "allow":
        problems.append("args: only with 'allow' (edit, then allow)")
    elif args is not None and not isinstance(args, dict):
        problems.append("args: must be an object, the call's arguments")
    if not isinstance(note, str):
        problems.append("note: must be a string")
    elif len(note) > NOTE_CHARS:
        problems.append(f"note: at most {NOTE_CHARS} characters")
    elif decision == REPLY and not note.strip():
        problems.append("note: a reply needs words")
    if problems:
        raise plans.PlanError(problems)
    require(user, "answer questions", actor=actor, step_id=step_id, decision=decision)
    with transaction.atomic():
        # Lock order everywhere: the task row, then its steps (the runner's claim holds the
        # task row while it writes the step).
        task_id = Step.objects.values_list("task_id", flat=True).get(pk=step_id)
        task = Task.objects.select_for_update().get(pk=task_id)
        step = Step.objects.select_for_update().get(pk=step_id)
        if step.state != StepState.BLOCKED:
            raise Refused(f"step '{step.key}' is {step.state}, not blocked")
        model = step.judge == "model"
        if decision == REPLY:
            journal.record(EventKind.DECISION, step=step, actor=actor, decision=decision, note=note)
            if not model or task.ended or step.question_kind != QuestionKind.MAY_I:
                # No decision: the question waits for its answer (a "Did this happen?" above
                # all: what the call did is not known, so it gets no result here).
                return step
            _answer_pending_call(step, f"{REPLIED} {note}", actor=actor)
            return _go_on(task, step, decision, actor)
        if DECISIONS[decision] != step.question_kind:
            raise Refused(
                f"'{decision}' does not answer \"{QuestionKind(step.question_kind).label}\""
            )
        if decision in RUN_AGAIN and task.ended:
            # It would put the step back to pending in a task that never runs again: Dad
            # would be told "do it" and nothing would happen.
            raise Refused(
                f"task {task.pk} is {task.state}: its steps never run again, so '{decision}' "
                f"can't be done; answer {' or '.join(repr(d) for d in _closing(step))}"
            )
        edited: dict[str, Any] = {}
        if args is not None:
            edited = _edit_call(step, args, actor=actor)
        journal.record(
            EventKind.DECISION, step=step, actor=actor, decision=decision, note=note, **edited
        )
        if decision == "deny" and model and not task.ended:
            why = f"{DENIED} {note}" if note else f"{DENIED} (no reason given)"
            _answer_pending_call(step, why, actor=actor)
            return _go_on(task, step, decision, actor)
        # An answer to "Did this happen?" settles exactly the effects its question names.
        asked = DECISIONS[decision] == QuestionKind.DID_IT_HAPPEN
        unsettled = questions.named(step, step.effects.order_by("created_at")) if asked else []
        if decision in ("deny", "fail"):
            cancel_unsettled(step, actor=actor)
            reason = "denied" if decision == "deny" else "failed"
            move_step(
                step,
                "fail",
                kind=EventKind.STEP_FAILED,
                actor=actor,
                fields=_cleared(
                    error=f"{reason} by {actor}" + (f": {note}" if note else ""),
                    finished_at=timezone.now(),
                ),
            )
            if decision == "deny" and task.state in (TaskState.RUNNING, TaskState.BLOCKED):
                # Dad said no to this call, not to the task: it waits for a replacement.
                move_task(task, "pause", actor=actor, data={"reason": DENIED_WAITS})
            else:
                after_step_failed(task, actor=actor)
            return step
        for effect in unsettled:
            if decision == "happened":
                move_effect(
                    effect,
                    "succeed",
                    actor=actor,
                    fields={
                        "response": {"settled_by": actor, "note": note},
                        "evidence": note or f"{actor} said it happened",
                    },
                )
            else:
                move_effect(effect, "rerun", actor=actor, fields={"evidence": "", "error": ""})
        return _go_on(task, step, decision, actor)


REPLY = "reply"
NOTE_CHARS = 4000
DENIED = "error: not made: Dad denied this call. His reason:"
REPLIED = "not made: Dad replied instead of answering (to ask him again, make the call again):"
DENIED_WAITS = "Dad denied a step: the task waits for a replacement or a resume"


def _go_on(task: Task, step: Step, decision: str, actor: str) -> Step:
    """The step back to `pending` with one authorization, of the call the question showed (a
    blocked step's call can't be edited but by the answer itself, and the outputs its args
    refer to are final, so it is the call now). A model step whose call was answered (denied,
    replied to) waits on no call: the authorization covers none, and Pippa goes on."""
    call = calls.of(step)
    move_step(
        step,
        "unblock",
        kind=EventKind.STEP_UNBLOCKED,
        actor=actor,
        fields=_cleared(authorized_by=actor, authorized_call=call),
        data={"decision": decision, "call": call},
    )
    follow(task, actor=actor)
    return step


def _answer_pending_call(step: Step, text: str, *, actor: str) -> None:
    """A model step's call that waits on Dad's answer gets `text` as its result (committed
    with the answer), so the step's next request carries it; nothing if none waits."""
    for one in transcript.dangling(transcript.entries(step)):
        transcript.add_result(step, one.call.get("id", ""), text, actor=actor)
        return


def _edit_model_call(step: Step, args: dict[str, Any]) -> dict[str, Any]:
    """Edit, then allow, for Pippa's call: the arguments are checked as the tool's (PlanError
    naming the field); the transcript keeps her call as she made it, and the decision's event
    the edit (`transcript.edit_of`): the call is made as edited, the authorization binds it,
    and her next requests are told (`prompt.Context`)."""
    call_id, name, before = transcript.pending(step)
    if not call_id:
        raise Refused(f"args: step '{step.key}' waits on no call of Pippa's to edit")
    tool = tools.get(name)
    problems = tool.check_args(args, f"step '{step.key}'")
    if problems:
        raise plans.PlanError(problems)
    if calls.canonical(args) == calls.canonical(before):
        return {}
    return {"call_id": call_id, "edited": {"before": before, "after": args}}


def _edit_call(step: Step, args: dict[str, Any], *, actor: str) -> dict[str, Any]:
    """Edit, then allow: the tool step's call becomes `args`, checked as the tool's arguments
    (PlanError naming the field; nothing changed). Journaled `step_edited` with the call as
    asked and as edited; effects never sent of the call as asked are cancelled. What the
    decision's event records."""
    if step.judge == "model":
        return _edit_model_call(step, args)
    fixed = calls.why_fixed(step)
    if fixed:
        raise Refused(fixed)
    before = dict(step.args or {})
    found = plans.check_step(
        {"key": step.key, **{name: getattr(step, name) for name in PLAN_FIELDS}, "args": args},
        where=f"step '{step.key}'",
    )
    if found.errors or found.spec is None:
        raise plans.PlanError(found.errors)
    after = found.spec.args
    if calls.canonical(after) == calls.canonical(before):
        return {}
    Step.objects.filter(pk=step.pk).update(args=after)
    step.args = after
    journal.record(
        EventKind.STEP_EDITED, step=step, actor=actor, fields=["args"], before=before, after=after
    )
    for effect in step.effects.filter(state=EffectState.PENDING).select_for_update():
        move_effect(effect, "cancel", actor=actor)
    return {"edited": {"before": before, "after": after}}


def withdraw_moot_questions(*, actor: str) -> int:
    """The "Did this happen?" questions the world answered after they were asked — a late report
    (a holder cut off, then back) settled every effect they named — go back to `pending`,
    journaled `step_unblocked` by the world; the next start finishes from the receipts, nothing
    performed again. Each in its own transaction (the task's row, then the step's). How many.
    Run by each worker at its heartbeat; the blocked steps are few (index step_state)."""
    moot = (
        Step.objects.blocked()
        .filter(question_kind=QuestionKind.DID_IT_HAPPEN)
        .exclude(effects__state=EffectState.UNCERTAIN)
        .values_list("pk", "task_id")
    )
    withdrawn = 0
    for step_id, task_id in list(moot[:50]):
        with transaction.atomic():
            task = Task.objects.select_for_update().get(pk=task_id)
            step = Step.objects.select_for_update().get(pk=step_id)
            if step.state != StepState.BLOCKED or step.question_kind != QuestionKind.DID_IT_HAPPEN:
                continue
            if step.effects.filter(state=EffectState.UNCERTAIN).exists():
                continue
            settled = list(step.effects.order_by("created_at").values_list("pk", "evidence"))
            move_step(
                step,
                "moot",
                kind=EventKind.STEP_UNBLOCKED,
                actor=actor,
                fields=_cleared(),
                data={
                    "decision": "answered by the world",
                    "why": "every effect it asked about was settled since it was asked",
                    "effects": [{"id": pk, "evidence": why} for pk, why in settled],
                },
            )
            follow(task, actor=actor)
            withdrawn += 1
    return withdrawn


# Decisions that ask the loop to run the step again.
RUN_AGAIN = ("allow", "rerun")


def _closing(step: Step) -> list[str]:
    """The decisions that still answer a blocked step's question once its task has ended."""
    return [d for d, kind in DECISIONS.items() if kind == step.question_kind and d not in RUN_AGAIN]


def _cleared(**fields: Any) -> dict[str, Any]:
    return {"question_kind": "", "question_text": "", **fields}


# ---- the admin ---------------------------------------------------------------------------------


PLAN_FIELDS = ("title", "tool", "args", "side_effect", "confirm_before", "max_attempts")


def edit_steps(
    *, task_id: int, edits: dict[int, dict[str, Any]], actor: str, user: Who
) -> tuple[list[Step], list[Step]]:
    """Change the plan fields (and positions) of pending steps: `edits` maps a step id to its
    changed fields. Each write is a compare-and-set on state='pending' and touches only the
    columns named, so nothing the loop writes is ever overwritten. A step that left pending
    meanwhile is skipped (and so is every position change, since the order it was part of no
    longer holds). Returns (edited, skipped); each edit is journaled as `step_edited`.

    An edit that changes a step's call (tool or args) clears its authorization, journaled as
    `authorization_cleared`, so the guard asks again; one to the call of a step with an
    effect beyond `pending` is refused, and nothing is changed (DESIGN.md §5)."""
    require(user, "edit steps", actor=actor, task_id=task_id)
    allowed = {*PLAN_FIELDS, "position"}
    for step_id, fields in edits.items():
        unknown = sorted(set(fields) - allowed)
        if unknown:
            raise Refused(f"{unknown[0]}: not a plan field of step {step_id}")
    edited: list[Step] = []
    skipped: list[Step] = []
    with transaction.atomic():
        Task.objects.select_for_update().get(pk=task_id)
        steps = {s.pk: s for s in Step.objects.filter(task_id=task_id, pk__in=list(edits))}
        if len(steps) != len(edits):
            raise Refused("a step in the edit is not in this task")
        moving = {pk: f["position"] for pk, f in edits.items() if "position" in f}
        reorder_dropped = bool(moving) and any(
            steps[pk].state != StepState.PENDING for pk in moving
        )
        if reorder_dropped:
            moving = {}
        elif sorted(moving.values()) != sorted(steps[pk].position for pk in moving):
            raise Refused("position: pending steps can only be reordered among themselves")
        new_calls = {  # the steps this edit will change, and whether it changes their call
            pk: calls.changes_call(steps[pk], fields)
            for pk, fields in edits.items()
            if steps[pk].state == StepState.PENDING
            and not (reorder_dropped and "position" in fields)
        }
        for pk in (pk for pk, changed in new_calls.items() if changed):
            fixed = calls.why_fixed(steps[pk])
            if fixed:
                raise Refused(fixed)
        checked = _checked_edits(task_id, steps, {pk: edits[pk] for pk in new_calls}, moving)
        if moving:
            top = Step.objects.filter(task_id=task_id).aggregate(top=Max("position"))["top"]
            for offset, pk in enumerate(moving):  # out of the way first: (task, position) is unique
                Step.objects.filter(pk=pk, state=StepState.PENDING).update(
                    position=top + 1 + offset
                )
            for pk, position in moving.items():
                Step.objects.filter(pk=pk, state=StepState.PENDING).update(position=position)
        for pk in edits:
            step = steps[pk]
            if pk not in new_calls:
                skipped.append(step)
                continue
            changes = checked[pk]
            cleared = new_calls[pk] and bool(step.authorized_by)
            writes = {
                **changes,
                **({"authorized_by": "", "authorized_call": ""} if cleared else {}),
            }
            if writes and Step.objects.filter(pk=pk, state=StepState.PENDING).update(**writes) != 1:
                skipped.append(step)  # it left pending after we read it
                continue
            names = sorted(changes) + (["position"] if pk in moving else [])
            if names:
                journal.record(EventKind.STEP_EDITED, step=step, actor=actor, fields=names)
                edited.append(step)
            if cleared:
                calls.journal_cleared(step, actor=actor, why=f"its call was edited by {actor}")
    return edited, skipped


def _checked_edits(
    task_id: int,
    steps: dict[int, Step],
    edits: dict[int, dict[str, Any]],
    moving: dict[int, int],
) -> dict[int, dict[str, Any]]:
    """Each edited step's plan fields as they will be written, checked whole by the plans'
    rule (`plans.check_step`, its references against the steps before it in the new order):
    PlanError naming every problem, or the changed fields as the plan would store them."""
    order: dict[str, int] = {}
    if any("args" in f or "position" in f for f in edits.values()):
        order = {
            key: moving.get(pk, position)
            for pk, key, position in Step.objects.filter(task_id=task_id).values_list(
                "pk", "key", "position"
            )
        }
    errors: list[str] = []
    checked: dict[int, dict[str, Any]] = {}
    for pk, fields in edits.items():
        step = steps[pk]
        changes = {k: v for k, v in fields.items() if k != "position"}
        at = moving.get(pk, step.position)
        found = plans.check_step(
            {"key": step.key, **{name: getattr(step, name) for name in PLAN_FIELDS}, **changes},
            where=f"step '{step.key}'",
            earlier={key for key, position in order.items() if position < at} if order else None,
        )
        errors.extend(found.errors)
        if found.spec is not None:
            written = {name: getattr(found.spec, name) for name in changes}
            if found.spec.confirm_before != step.confirm_before:
                written["confirm_before"] = found.spec.confirm_before  # only a side effect asks
            checked[pk] = written
    if errors:
        raise plans.PlanError(errors)
    return checked
