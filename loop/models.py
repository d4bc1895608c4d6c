"""Task, Step, Effect, Event, Worker; the API's AgentToken and Receipt.

State fields are written only through `loop.transitions` (compare-and-set, checked against
`loop.states`, journaled in the same transaction). Admin forms and views never write them.
"""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.db import models
from django.utils import timezone

from .states import STEP, TASK


class TaskState(models.TextChoices):
    PLANNING = "planning", "Planning"
    """Created from a goal: its planning step runs (Pippa writes the plan with add_steps)."""
    RUNNING = "running", "Running"
    """Workers may claim it and run its next step."""
    PAUSED = "paused", "Paused"
    """Interrupted by a person, or a step failed while others remain."""
    BLOCKED = "blocked", "Blocked"
    """Its current step waits for a person's answer."""
    DONE = "done", "Done"
    """Every step is done (or a person resumed past its failure)."""
    FAILED = "failed", "Failed"
    """A step failed and nothing runnable remains."""
    SUPERSEDED = "superseded", "Superseded"
    """Replaced by a successor task; its pending steps never run."""


# TaskState's labels in a person's words, where the machine's label is jargon; the choices keep
# their labels (a migration's business) and the pages show these (Task.get_state_display).
TASK_STATE_WORDS = {**dict(TaskState.choices), TaskState.SUPERSEDED: "Replaced"}


class StepState(models.TextChoices):
    PENDING = "pending", "Pending"
    """Not started, or put back by a person's decision."""
    RUNNING = "running", "Running"
    """Started; in flight, cut, or waiting for retry_at after a transient error."""
    BLOCKED = "blocked", "Blocked"
    """Waits for a person: "May I do this?" or "Did this happen?"."""
    DONE = "done", "Done"
    """Finished with an output. Never runs again."""
    FAILED = "failed", "Failed"
    """Definitively failed, denied, or out of attempts. Never runs again."""


class EffectState(models.TextChoices):
    PENDING = "pending", "Pending"
    """The intent is committed; it has certainly not been sent."""
    RUNNING = "running", "Running"
    """Claimed under a lease: it may have gone out."""
    SUCCEEDED = "succeeded", "Succeeded"
    """It happened; `response` is the receipt."""
    FAILED = "failed", "Failed"
    """The world said no, definitively."""
    UNCERTAIN = "uncertain", "Uncertain"
    """It may or may not have happened; a person or a probe settles it."""
    CANCELLED = "cancelled", "Cancelled"
    """Its step was failed by a person before it was settled."""


class QuestionKind(models.TextChoices):
    MAY_I = "may_i", "May I do this?"
    DID_IT_HAPPEN = "did_it_happen", "Did this happen?"


class WorkerState(models.TextChoices):
    RUNNING = "running", "Running"
    PARKED = "parked", "Parked"
    """Alive but refusing new work (low disk, failing writes)."""
    STOPPED = "stopped", "Stopped"
    DEAD = "dead", "Dead"
    """Found dead by a later worker's boot reconciliation."""


class EventKind(models.TextChoices):
    TASK_CREATED = "task_created"
    TASK_STATE = "task_state"
    STEPS_ADDED = "steps_added"
    STEP_STARTED = "step_started"
    STEP_RESTARTED = "step_restarted"
    STEP_DONE = "step_done"
    STEP_RETRY = "step_retry"
    STEP_FAILED = "step_failed"
    STEP_BLOCKED = "step_blocked"
    STEP_UNBLOCKED = "step_unblocked"
    STEP_EDITED = "step_edited"
    DECISION = "decision"
    DECISION_REFUSED = "decision_refused"
    AUTHORIZATION_CONSUMED = "authorization_consumed"
    AUTHORIZATION_CLEARED = "authorization_cleared"
    CALL_REFUSED = "call_refused"
    SIDE_EFFECT_AUTO_CONFIRMED = "side_effect_auto_confirmed"
    SIDE_EFFECT_RESUMED_UNSENT = "side_effect_resumed_unsent"
    EFFECT_STATE = "effect_state"
    RECEIPT_HIT = "receipt_hit"
    PROBE = "probe"
    LATE_RESULT = "late_result"
    LEASE_RELEASED = "lease_released"
    WORKER_STARTED = "worker_started"
    WORKER_DEAD = "worker_dead"
    WORKER_STOPPED = "worker_stopped"
    WORKER_PARKED = "worker_parked"
    WRITE_FAILED = "write_failed"
    MESSAGE_POSTED = "message_posted"
    SCHEDULE_CREATED = "schedule_created"
    SCHEDULE_EDITED = "schedule_edited"
    SCHEDULE_FIRED = "schedule_fired"
    SCHEDULE_FAILED = "schedule_failed"
    MODEL_RETRY = "model_retry"
    MODEL_CALL_REFUSED = "model_call_refused"
    TRANSCRIPT_ENTRY = "transcript_entry"  # a model step's transcript grew (the live feed)
    PLAN_APPROVED = "plan_approved"  # a person approved a proposal: the calls it covers
    PLAN_DECLINED = "plan_declined"
    TASK_GIVEN = "task_given"  # a person gave the task to an agent to drive


class Writer(models.TextChoices):
    """Who wrote a step (DESIGN.md §5, "Who wrote it"): authority comes from a person."""

    PERSON = "person", "a person"
    """Dad on the dashboard or in the admin, or a plan file at the shell."""
    SCHEDULE = "schedule", "a schedule"
    """A schedule's template, as Dad wrote it: its runs' steps."""
    PIPPA = "pippa", "Pippa"
    """The model (a step and its attempt): a proposal until a person's answer covers it."""
    AGENT = "agent", "an agent"
    """An outside agent over the API (its token's name): a proposal, as Pippa's."""


# The writers whose steps follow `confirm_before` as written (a person's, or a person's ahead
# of time); the others' side effects wait for a person's answer (`LOOP_CONFIRM_PLANS`).
PERSON_WRITERS = (Writer.PERSON, Writer.SCHEDULE)


class Origin(models.TextChoices):
    PLAN = "plan", "Plan file"
    API = "api", "API"
    DASHBOARD = "dashboard", "Dashboard"
    SCHEDULE = "schedule", "Schedule"
    CONVERSATION = "conversation", "Conversation"


# The task states nothing leaves (done, failed, superseded), in the order of TaskState: the
# table `states.TASK` decides which they are.
ENDED_TASK_STATES = tuple(s for s in TaskState if s in TASK.terminal)


def lease_free_at(now: datetime) -> models.Q:
    """Nobody holds the task's lease at `now`: never taken, released, or run out."""
    return models.Q(lease_until__isnull=True) | models.Q(lease_until__lt=now)


def retry_due_at(now: datetime) -> models.Q:
    """The task waits for no retry after `now` (`run_after`)."""
    return models.Q(run_after__isnull=True) | models.Q(run_after__lte=now)


# The task states a claim takes: a running task's next step, and a planning task's planning
# step (DESIGN.md §12). The claim orders by CLAIM_ORDER, which the index task_claim (state,
# lease_epoch, id) serves for a state IN (...) without a sort: a planning task ('planning'
# sorts before 'running') is taken before the running ones, least-claimed first within each.
CLAIMABLE_TASK_STATES = (TaskState.PLANNING, TaskState.RUNNING)
CLAIMABLE_TASK = models.Q(state__in=CLAIMABLE_TASK_STATES)
CLAIM_ORDER = ("state", "lease_epoch", "id")


def claimable_at(now: datetime) -> models.Q:
    """The one "claimable" rule, with `CLAIMABLE_TASK` (its states): the lease is free and any
    retry is due. The claim statements (`loop.sql.claim_free_tasks`, `claim_one_task`) are
    compiled from these same conditions; the ORM's form is `Task.objects.claimable()`."""
    return lease_free_at(now) & retry_due_at(now)


class TaskQuerySet(models.QuerySet["Task"]):
    def running(self) -> TaskQuerySet:
        return self.filter(state=TaskState.RUNNING)

    def claimable(self, now: datetime | None = None) -> TaskQuerySet:
        """Running and planning tasks a worker may claim now (`CLAIMABLE_TASK`,
        `claimable_at`). An idle worker looks with `sql.any_claimable`, written from the same
        conditions, before it takes the write lock to claim."""
        return self.filter(CLAIMABLE_TASK & claimable_at(now or timezone.now()))

    def open(self) -> TaskQuerySet:
        return self.exclude(state__in=ENDED_TASK_STATES)


class Task(models.Model):
    title = models.CharField(max_length=200)
    state = models.CharField(max_length=16, choices=TaskState.choices, default=TaskState.PLANNING)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)
    created_by = models.CharField(max_length=150, blank=True)
    successor = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="predecessors"
    )
    # The agent that may drive it over the API (`next`, `commit`, `effects`): the one that
    # created it, or the one a person gave it to; "" for none (DESIGN.md §19).
    driver = models.CharField(max_length=100, blank=True)
    # Earliest time a worker may claim it again (a step waiting for retry_at).
    run_after = models.DateTimeField(null=True, blank=True)
    # The lease (§8). lease_epoch is the fencing token: every claim bumps it.
    lease_owner = models.BigIntegerField(null=True, blank=True)
    lease_until = models.DateTimeField(null=True, blank=True)
    lease_epoch = models.BigIntegerField(default=0)
    # Where it came from (§10). A schedule's run also names the message it posted: while that
    # message is the conversation's latest, the task has a standing authorization.
    origin = models.CharField(max_length=16, choices=Origin.choices, default=Origin.PLAN)
    origin_run = models.ForeignKey(
        "ScheduleRun", null=True, blank=True, on_delete=models.SET_NULL, related_name="tasks"
    )
    origin_message = models.ForeignKey(
        "Message", null=True, blank=True, on_delete=models.SET_NULL, related_name="tasks"
    )

    # The plan's goal in words (what the model judge is shown of the task).
    instructions = models.TextField(blank=True)

    objects = TaskQuerySet.as_manager()

    class Meta:
        indexes = [
            # The claim (sql.claim_free_tasks, for lease.claim_many): state IN ('planning',
            # 'running') AND claimable, ORDER BY state, lease_epoch, id (CLAIM_ORDER: one
            # ordered descent per state, no sort); and an idle worker's look before it
            # (sql.any_claimable, Task.objects.claimable().exists() by hand).
            models.Index(fields=["state", "lease_epoch", "id"], name="task_claim"),
            # Boot reconciliation finds and releases a dead worker's leases (boot.reconcile).
            models.Index(fields=["lease_owner"], name="task_lease_owner"),
        ]

    def __str__(self) -> str:
        return f"task {self.pk} {self.title!r}"

    def get_state_display(self) -> str:  # type: ignore[no-redef]
        """The state as a person reads it: a superseded task is "Replaced" (by a new plan)."""
        return TASK_STATE_WORDS.get(self.state, self.state.title())

    @property
    def ended(self) -> bool:
        """Done, failed or superseded (`states.TASK.terminal`): its steps never run again."""
        return self.state in TASK.terminal


# Neither done nor failed: the steps still to run, in plan order (`states.STEP` decides which
# they are). One rule for the partial index step_open (its condition), `Step.objects.open()`
# and the statement that reads each task's first open step (sql.first_open_steps, compiled
# from OPEN_STEP and OPEN_STEP_ORDER).
OPEN_STEP_STATES = tuple(s for s in StepState if s not in STEP.terminal)
OPEN_STEP = models.Q(state__in=OPEN_STEP_STATES)
OPEN_STEP_ORDER = ("position",)
# The partial index step_failed's condition, and `Step.objects.failed()`.
FAILED_STEP = models.Q(state=StepState.FAILED)


class StepQuerySet(models.QuerySet["Step"]):
    def open(self) -> StepQuerySet:
        """Neither done nor failed: the loop's candidates, in plan order."""
        return self.filter(OPEN_STEP).order_by(*OPEN_STEP_ORDER)

    def failed(self) -> StepQuerySet:
        return self.filter(FAILED_STEP)

    def blocked(self) -> StepQuerySet:
        return self.filter(state=StepState.BLOCKED)


class Step(models.Model):
    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="steps")
    position = models.IntegerField()
    key = models.CharField(max_length=100)
    title = models.CharField(max_length=200, blank=True)
    tool = models.CharField(max_length=100)
    args = models.JSONField(default=dict, blank=True)
    side_effect = models.BooleanField(default=False)
    confirm_before = models.BooleanField(default=False)
    max_attempts = models.PositiveIntegerField(default=5)
    # Who performs it (DESIGN.md §12): "tool" runs `tool` with `args`; "model" is a model's
    # turn, told what to do in `instructions`, offered `tools` (names; empty: the read-only
    # built-ins).
    judge = models.CharField(max_length=8, default="tool")
    instructions = models.TextField(blank=True)
    tools = models.JSONField(default=list, blank=True)

    state = models.CharField(max_length=16, choices=StepState.choices, default=StepState.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    output = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    # Set only by a recorded `retry` verdict: a running step with retry_at is no cut.
    retry_at = models.DateTimeField(null=True, blank=True)
    question_kind = models.CharField(max_length=16, choices=QuestionKind.choices, blank=True)
    question_text = models.TextField(blank=True)
    # A person's one-shot permission for the next start; consumed in that start's commit.
    authorized_by = models.CharField(max_length=150, blank=True)
    # The digest of the call that permission was given for (`loop.calls`): a start consumes
    # it only for that call, and an edit of the call clears it.
    authorized_call = models.CharField(max_length=64, blank=True)
    # A person resumed the task past this failed step (or added its replacement).
    waived = models.BooleanField(default=False)
    # Who wrote it (DESIGN.md §5): `writer` the kind, `written_by` the name as Dad reads it
    # (a user, a schedule, "Pippa (step 'plan', attempt 1)", an agent's token name).
    writer = models.CharField(max_length=16, choices=Writer.choices, default=Writer.PERSON)
    written_by = models.CharField(max_length=200, blank=True)
    # Written by Pippa or an agent and not yet approved by a person (LOOP_CONFIRM_PLANS): the
    # task waits, paused, until a person approves or declines the proposal.
    proposed = models.BooleanField(default=False)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = StepQuerySet.as_manager()

    class Meta:
        ordering = ["task", "position"]
        constraints = [
            models.UniqueConstraint(fields=["task", "key"], name="step_key_unique"),
            models.UniqueConstraint(fields=["task", "position"], name="step_position_unique"),
        ]
        indexes = [
            # The dashboard's "Needs you": every blocked step (Step.objects.blocked()).
            models.Index(fields=["state"], name="step_state"),
            # A task's first open step, and how many it has left (sql.first_open_steps and
            # sql.step_counts, through open_steps: the tick's next step, actions.follow, the
            # dashboard's progress and current step): partial, so it holds only the steps
            # still to run and the lookup never walks a task's done steps.
            models.Index(fields=["task", "position"], condition=OPEN_STEP, name="step_open"),
            # Whether a task that has nothing left to run failed (sql.has_unwaived_failure,
            # for actions.follow), and the dashboard's count of failed steps (sql.step_counts):
            # failed steps are few.
            models.Index(fields=["task", "position"], condition=FAILED_STEP, name="step_failed"),
            # A task's proposal waiting for a person (goals.waits_for_approval, the approval
            # card): partial, so it holds only the few proposed steps.
            models.Index(
                fields=["task", "position"], condition=models.Q(proposed=True), name="step_proposed"
            ),
        ]
        permissions = [("confirm_step", "Can answer a blocked step's question")]

    def __str__(self) -> str:
        return f"step {self.key!r} of task {self.task_id}"


class EffectQuerySet(models.QuerySet["Effect"]):
    def unsettled(self) -> EffectQuerySet:
        return self.filter(state__in=[EffectState.RUNNING, EffectState.UNCERTAIN])


class Effect(models.Model):
    # Deterministic (DESIGN.md §6, `effects.effect_id`): a digest of (the installation, the
    # step, the tool, the canonical request, `again`).
    id = models.CharField(max_length=64, primary_key=True)
    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="effects")
    step = models.ForeignKey(Step, on_delete=models.CASCADE, related_name="effects")
    tool = models.CharField(max_length=100)
    safe_to_repeat = models.BooleanField(default=False)
    target = models.CharField(max_length=500, blank=True)
    summary = models.TextField(blank=True)
    request = models.JSONField(default=dict)
    state = models.CharField(
        max_length=16, choices=EffectState.choices, default=EffectState.PENDING
    )
    response = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    evidence = models.TextField(blank=True)
    lease_owner = models.BigIntegerField(null=True, blank=True)
    lease_until = models.DateTimeField(null=True, blank=True)
    lease_epoch = models.BigIntegerField(null=True, blank=True)
    sends = models.PositiveIntegerField(default=0)
    # The call it performs (`calls.digest` of its tool and request): the same call again in
    # its step is this effect, unless a person allowed it once more (`again` counts those).
    call = models.CharField(max_length=64, blank=True)
    again = models.PositiveIntegerField(default=0)
    # The caller's own idempotency key (an agent's), scoped to the step: bound to this request.
    key = models.CharField(max_length=255, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    objects = EffectQuerySet.as_manager()

    class Meta:
        indexes = [
            # Boot reconciliation: a dead owner's effects in `running`.
            models.Index(fields=["lease_owner", "state"], name="effect_owner_state"),
        ]

    def __str__(self) -> str:
        return f"effect {self.tool} {self.target}"


class TranscriptEntry(models.Model):
    """One message of a model step's conversation (DESIGN.md §12), across its attempts: an
    assistant reply with its tool calls in one row, each call's result in one row of its own."""

    class Role(models.TextChoices):
        SYSTEM = "system"
        USER = "user"
        ASSISTANT = "assistant"
        TOOL = "tool"

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="transcript")
    step = models.ForeignKey(Step, on_delete=models.CASCADE, related_name="transcript")
    attempt = models.PositiveIntegerField()
    seq = models.PositiveIntegerField()  # its place in the step's conversation
    role = models.CharField(max_length=16, choices=Role.choices)
    content = models.TextField(blank=True)
    tool_calls = models.JSONField(default=list, blank=True)  # [{"id", "name", "arguments"}]
    tool_call_id = models.CharField(max_length=200, blank=True)
    # The effect a side-effect call produced (on its result's row); no constraint, as Event's.
    effect_id = models.CharField(max_length=64, blank=True)
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["step", "seq"]
        constraints = [
            # The conversation's order; also the index that reads a step's transcript.
            models.UniqueConstraint(fields=["step", "seq"], name="transcript_step_seq"),
            # At most one result per call.
            models.UniqueConstraint(
                fields=["step", "tool_call_id"],
                condition=models.Q(role="tool"),
                name="transcript_one_result",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.role} #{self.seq} of step {self.step_id}"


class Event(models.Model):
    """The append-only journal; also the live feed (rising ids)."""

    kind = models.CharField(max_length=40, choices=EventKind.choices)
    # Indexed by `event_task` (task, id), which serves every lookup by task: one index fewer
    # for each journal row to update.
    task = models.ForeignKey(Task, null=True, blank=True, on_delete=models.CASCADE, db_index=False)
    step = models.ForeignKey(Step, null=True, blank=True, on_delete=models.CASCADE)
    # Neither indexed nor constrained in the database. Effect ids are random hashes, so each
    # journal row naming one landed on a random page of such an index: 9 of the ~25 pages a
    # worker's batch commit wrote to SQLite's WAL (16 without it). Nothing looks events up by
    # effect; an event naming an effect names its step too (journal.record insists), and that
    # step's cascade removes the event with the effect.
    effect = models.ForeignKey(
        Effect,
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        db_index=False,
        db_constraint=False,
    )
    actor = models.CharField(max_length=150, blank=True)
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["task", "id"], name="event_task")]

    def __str__(self) -> str:
        return f"#{self.pk} {self.kind}"


class Worker(models.Model):
    """One `runloop` incarnation: a new row at every start, even under a reused label."""

    label = models.CharField(max_length=100, blank=True)
    host = models.CharField(max_length=255)
    pid = models.IntegerField()
    # /proc start time of the pid, so a recycled pid is not mistaken for this process.
    pid_started = models.CharField(max_length=32, blank=True)
    # The machine whose process table knows the pid (DESIGN.md §9): the kernel's boot id and
    # the pid namespace. Only a peer with the same (host, boot_id, pid_ns) reads the pid;
    # to any other, and when either is unknown (''), only the heartbeat tells (boot.py).
    boot_id = models.CharField(max_length=64, blank=True)
    pid_ns = models.CharField(max_length=64, blank=True)
    # This host's clock minus the database's, in seconds, as its last heartbeat measured it
    # (loop/clock.py); /healthz names a worker off by more than LOOP_CLOCK_SKEW_SECONDS.
    clock_offset = models.FloatField(null=True, blank=True)
    state = models.CharField(
        max_length=16, choices=WorkerState.choices, default=WorkerState.RUNNING
    )
    started_at = models.DateTimeField(default=timezone.now)
    last_seen = models.DateTimeField(default=timezone.now)
    parked_reason = models.TextField(blank=True)
    last_error = models.TextField(blank=True)
    last_error_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        # The live workers (health.problems; boot.dead_workers reads those not yet dead).
        indexes = [models.Index(fields=["state", "last_seen"], name="worker_alive")]

    def __str__(self) -> str:
        return f"worker {self.pk} ({self.label or self.host}:{self.pid})"


class AgentToken(models.Model):
    """An outside agent's credential for the HTTP API. Only the SHA-256 digest of the token
    is kept; the token itself is shown once, when it is made (`manage.py agent_token`)."""

    name = models.CharField(max_length=100)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="agent_tokens"
    )  # whose permissions the agent acts with (e.g. loop.confirm_step for unblock)
    digest = models.CharField(max_length=64, unique=True)  # the API looks tokens up by it
    prefix = models.CharField(max_length=8)  # the token's first characters, to tell them apart
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)  # None: until revoked
    revoked = models.BooleanField(default=False)
    # A person's own client (`agent_token --answers`): it may answer questions and approve
    # plans as its user. Any other agent token never does, whatever its user may do.
    answers = models.BooleanField(default=False)

    class Meta:
        constraints = [
            # A revoked token's name may be given to its replacement.
            models.UniqueConstraint(
                fields=["name"], condition=models.Q(revoked=False), name="agent_token_live_name"
            ),
        ]

    def __str__(self) -> str:
        return f"agent {self.name} ({self.prefix}…)"

    @property
    def actor(self) -> str:
        return f"agent:{self.name}"

    @property
    def lease_owner(self) -> int:
        """The agent's lease owner id: negative, so it never collides with a Worker's id (and
        boot reconciliation, which retires dead workers' leases, never touches it)."""
        return -self.pk


class Receipt(models.Model):
    """The stored answer to one API command (DESIGN.md §7): the same command id again gets
    this answer and nothing is done twice; with another body or scope it is refused."""

    agent = models.ForeignKey(AgentToken, on_delete=models.CASCADE, related_name="receipts")
    command_id = models.CharField(max_length=255)  # the request's Idempotency-Key
    scope = models.CharField(max_length=300)  # method and path: "POST /api/tasks/12/pause"
    digest = models.CharField(max_length=64)  # SHA-256 of the request body
    status = models.PositiveSmallIntegerField()
    body = models.JSONField()
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            # Command ids are the agent's own: another agent's key never replays this answer.
            models.UniqueConstraint(fields=["agent", "command_id"], name="receipt_command_unique"),
        ]

    def __str__(self) -> str:
        return f"receipt {self.command_id} {self.scope} {self.status}"


class Installation(models.Model):
    """One row, made once per database (migration 0012): its random `secret` goes into every
    effect id, so two databases never share an effect id, nor an Idempotency-Key at a
    receiver (DESIGN.md §6, invariant 15)."""

    secret = models.CharField(max_length=64)
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"installation {self.secret[:8]}…"


class HealthCheck(models.Model):
    """Never committed: /healthz inserts a row large enough to need new pages, then rolls
    back, to learn whether the database can take a write right now."""

    payload = models.BinaryField()

    def __str__(self) -> str:
        return f"health check {self.pk}"


class Clock(models.Model):
    """A person's own clock: the time zone every page shows times in (else TIME_ZONE)."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="clock"
    )
    time_zone = models.CharField(max_length=64)

    def __str__(self) -> str:
        return f"{self.user_id}: {self.time_zone}"


# The conversation and schedules live in their own module; they are `loop` models all the same.
# The notifier's rows (DESIGN.md §17) live in its own package.
from .notify.models import NotifyCursor, PushSubscription, QuestionNotice  # noqa: E402, F401
from .talk import AuthorKind, Message, Schedule, ScheduleRun  # noqa: E402, F401
