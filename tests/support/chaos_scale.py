"""Chaos at scale on PostgreSQL (tests/test_chaos_pg.py, bench/chaos_pg.py): several real
`runloop` workers on one database, a busy one SIGKILLed every so often and started again,
every step a side effect to a real receiver (tests/support/chaos_sinks.py).

Afterwards the journal and the receivers are checked: no step was started by a second worker
while its first holder still held it (unless that holder was found dead or its lease released
in between: the fence), no verdict came from a worker that no longer held the step, nothing
was delivered twice or outside a committed `running` effect, and every question the loop
asked was one the receivers' records could answer (tests/support/truth.py answers them).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.utils import timezone

from loop import actions, plans
from loop.models import Effect, EffectState, Event, EventKind, Step, Task, Worker
from loop.permissions import SYSTEM
from loop.tools.mail import message_id

from .chaos_sinks import HttpSink, SmtpSink
from .truth import Person

ROOT = Path(__file__).resolve().parents[2]
ENDS = {EventKind.STEP_DONE, EventKind.STEP_RETRY, EventKind.STEP_FAILED, EventKind.STEP_BLOCKED}
STARTS = {EventKind.STEP_STARTED, EventKind.STEP_RESTARTED}


@dataclass
class Figures:
    workers: int
    tasks: int
    kills: int = 0
    seconds: float = 0.0
    steps_done: int = 0
    effects: int = 0
    emails: int = 0
    posts: int = 0
    duplicates: int = 0
    violations: list[str] = field(default_factory=list)
    overlaps: list[str] = field(default_factory=list)
    questions: Counter[str] = field(default_factory=Counter)
    answers: Counter[str] = field(default_factory=Counter)
    probes_settled: int = 0
    unfinished: int = 0
    # Questions by the worker (one incarnation: one kill) whose start each asked step had last.
    asked_by: Counter[str] = field(default_factory=Counter)

    @property
    def most_from_one_kill(self) -> int:
        return max(self.asked_by.values(), default=0)

    def table(self) -> str:
        rows = [
            ("workers", self.workers),
            ("tasks x steps", f"{self.tasks} x 5"),
            ("seconds", round(self.seconds, 1)),
            ("kills (SIGKILL)", self.kills),
            ("steps done", self.steps_done),
            ("effects", self.effects),
            ("emails delivered", self.emails),
            ("posts delivered", self.posts),
            ("duplicate deliveries", self.duplicates),
            ("deliveries outside a running effect", len(self.violations)),
            ("steps held by two workers at once", len(self.overlaps)),
            ("settled by a probe", self.probes_settled),
            *((f"questions: {k}", n) for k, n in sorted(self.questions.items())),
            *((f"answers: {k}", n) for k, n in sorted(self.answers.items())),
            ("most questions from one kill", self.most_from_one_kill),
            ("tasks not done", self.unfinished),
        ]
        width = max(len(name) for name, _ in rows)
        return "\n".join(f"{name:<{width}} | {value}" for name, value in rows)


def plan(n: int, web: HttpSink, rng: random.Random) -> dict[str, Any]:
    """Five side-effect steps: two emails, a POST the receiver can be asked about, one it
    cannot tell about (a person must answer), and another probe-able POST; in random order."""

    def mark(key: str) -> str:
        return f"chaos {n}/{key}"

    def mail(key: str) -> dict[str, Any]:
        args = {"to": ["dad@example.com"], "subject": mark(key), "body": mark(key)}
        return {"key": key, "tool": "email.send", "args": args, "max_attempts": 100}

    def post(key: str, hook: str) -> dict[str, Any]:
        args = {"url": web.url(hook), "json": {"marker": mark(key)}}
        return {"key": key, "tool": "http.post", "args": args, "max_attempts": 100}

    steps = [
        mail("mail-1"),
        post("post-probed", "/hook/probe"),
        post("post-other", "/hook/other"),
        mail("mail-2"),
        post("post-probed-2", "/hook/probe"),
    ]
    rng.shuffle(steps)
    return {"title": f"chaos {n}", "steps": steps}


def worker_env(base: dict[str, str], smtp: SmtpSink, web: HttpSink) -> dict[str, str]:
    return {
        **base,
        "EMAIL_HOST": "127.0.0.1",
        "EMAIL_PORT": str(smtp.port),
        "EMAIL_TIMEOUT": "10",
        "LOOP_HTTP_PROBE_URL": web.url("/probe/{key}"),
        "LOOP_HTTP_ALLOW": "127.0.0.1",  # the sinks run here
        "LOOP_HTTP_TIMEOUT": "10",
        "LOOP_IDLE_SLEEP_MS": "20",
        "LOOP_RETRY_BASE_SECONDS": "0",
        "LOOP_MIN_FREE_MB": "0",
        "LOOP_LOG_LEVEL": "WARNING",
        "PYTHONUNBUFFERED": "1",
    }


def start(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "runloop"],
            env=env,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def run(
    env: dict[str, str],
    smtp: SmtpSink,
    web: HttpSink,
    *,
    workers: int,
    tasks: int,
    kill_every: float,
    max_kills: int,
    min_kills: int = 0,
    seed: int,
    log: Path,
    timeout: float,
) -> Figures:
    """Create `tasks` tasks (keeping about two per worker open at a time), SIGKILL a random
    busy worker (one holding a task's lease) every `kill_every` seconds (give or take half), at
    most `max_kills` times, and start another in its place, answering questions as they come,
    until every task is done; then check. The last tasks are created only after `min_kills`
    kills."""
    rng = random.Random(seed)
    person = Person(web=web, smtp=smtp)
    figures = Figures(workers=workers, tasks=tasks)
    procs = [start(env, log) for _ in range(workers)]
    began = time.monotonic()
    next_kill = began + rng.uniform(0.5, 1.5) * kill_every
    created = 0
    try:
        while True:
            now = time.monotonic()
            due = now >= next_kill and figures.kills < max_kills
            # A kill waits for a worker with work in hand (an idle one cuts nothing).
            busy = busy_workers(procs) if due else []
            if busy:
                victim = rng.choice(busy)
                os.kill(procs[victim].pid, signal.SIGKILL)
                procs[victim].wait(timeout=30)
                procs[victim] = start(env, log)
                figures.kills += 1
                next_kill = now + rng.uniform(0.5, 1.5) * kill_every
            # Before `min_kills`, tasks come in proportion to the kills so far, and a due kill
            # that found nobody busy lets the next few in: however fast the machine, that many
            # kills land among work.
            ahead = 1 if due and not busy else 0
            paced = (
                tasks
                if figures.kills >= min_kills
                else tasks * (figures.kills + 1 + ahead) // (min_kills + 1)
            )
            open_now = Task.objects.open().count()
            while created < max(paced, 1) and open_now < 2 * workers:
                created += 1
                open_now += 1
                actions.create_task(
                    plan=plans.validate(plan(created, web, rng)), actor="chaos", user=SYSTEM
                )
            person.answer_questions()
            if created == tasks and not Task.objects.open().exists():
                break
            if now > began + timeout:
                break
            time.sleep(0.05)
    finally:
        figures.seconds = time.monotonic() - began
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    check(figures, smtp, web, person)
    return figures


def busy_workers(procs: list[subprocess.Popen[bytes]]) -> list[int]:
    """The indexes in `procs` of the workers that hold a task's lease now."""
    holders = Task.objects.filter(lease_owner__isnull=False, lease_until__gt=timezone.now())
    pids = set(
        Worker.objects.filter(pk__in=holders.values("lease_owner")).values_list("pid", flat=True)
    )
    return [n for n, proc in enumerate(procs) if proc.pid in pids]


def check(figures: Figures, smtp: SmtpSink, web: HttpSink, person: Person) -> None:
    mails, posts = smtp.record.counts(), web.record.counts()
    figures.emails, figures.posts = sum(mails.values()), sum(posts.values())
    figures.duplicates = sum(n - 1 for n in (mails + posts).values() if n > 1)
    figures.violations = smtp.record.violations + web.record.violations
    effects = list(Effect.objects.all())
    figures.effects = len(effects)
    for effect in effects:
        key = message_id(effect.pk) if effect.tool == "email.send" else effect.pk
        got = (mails if effect.tool == "email.send" else posts)[key]
        if effect.state == EffectState.SUCCEEDED and got != 1:
            figures.violations.append(f"effect {effect.pk} succeeded, delivered {got} times")
    figures.steps_done = Step.objects.filter(state="done").count()
    figures.unfinished = Task.objects.open().count()
    figures.questions, figures.answers = person.asked, person.answers
    figures.probes_settled = Event.objects.filter(kind=EventKind.PROBE, data__found=True).count()
    figures.overlaps = overlaps()
    figures.asked_by = askers()


def askers() -> Counter[str]:
    """For each question asked, the worker whose start of the step came last before it: its
    cut is what the question is about. A worker holds at most one call that would ask if cut,
    so no incarnation (one kill) may count more than one."""
    last_start: dict[int, str] = {}
    found: Counter[str] = Counter()
    rows = Event.objects.filter(kind__in=[*STARTS, EventKind.STEP_BLOCKED]).order_by("id")
    for kind, step, actor in rows.values_list("kind", "step_id", "actor").iterator():
        if kind in STARTS:
            last_start[step] = actor
        else:
            found[last_start.get(step, "never started")] += 1
    return found


def overlaps() -> list[str]:
    """Steps that a second worker started, or a worker gave a verdict on, while another
    worker held them without a fence in between (its death found, or the task's lease
    released), from the journal."""
    dead: dict[int, list[int]] = {}  # worker -> ids of events finding it dead
    released: dict[tuple[int, int], list[int]] = {}  # (task, worker) -> lease_released ids
    found = []
    holder: dict[int, tuple[str, int]] = {}  # step -> (actor, id of its start)

    def fenced(task: int, actor: str, since: int, until: int) -> bool:
        worker = int(actor.removeprefix("worker:"))
        fences = dead.get(worker, []) + released.get((task, worker), [])
        return any(since < at < until for at in fences)

    rows = Event.objects.order_by("id").values_list(
        "id", "kind", "task_id", "step_id", "actor", "data"
    )
    for at, kind, task, step, actor, data in rows.iterator():
        if kind == EventKind.WORKER_DEAD:
            dead.setdefault(data["worker"], []).append(at)
        elif kind == EventKind.LEASE_RELEASED:
            released.setdefault((task, data["worker"]), []).append(at)
        elif step is None or not actor.startswith("worker:"):
            if kind in ENDS:
                holder.pop(step, None)  # settled by a boot or a person: nobody holds it
        elif kind in STARTS:
            held = holder.get(step)
            if held and held[0] != actor and not fenced(task, held[0], held[1], at):
                found.append(
                    f"step {step}: {actor} started it at event {at} while {held[0]} held it (since {held[1]})"
                )
            holder[step] = (actor, at)
        elif kind in ENDS:
            held = holder.pop(step, None)
            if held and held[0] != actor and not fenced(task, held[0], held[1], at):
                found.append(
                    f"step {step}: {actor} gave a verdict ({kind}) at {at} while {held[0]} held it"
                )
    return found
