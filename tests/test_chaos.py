"""Chaos: a real worker SIGKILLed at random moments, hundreds of times, against real sinks.

An SMTP server and an HTTP receiver record every delivery (and check, as it arrives, that its
effect was committed `running`). Between kills the test answers every question the loop asks
as the truth demands — the sinks know what happened — and checks that the question was one the
database could not answer. Afterwards every task is done and nothing was delivered twice.

The same run (seed, plans, kill times) goes twice against the same receivers, which hold each
POST a while and deduplicate on `Idempotency-Key`: once with the HTTP receiver listed in
LOOP_IDEMPOTENT_RECEIVERS — its POSTs are then safe to repeat and share batches, and no
question may be about one — and once unlisted, when a worker sends them one at a time. Either
way a killed worker leaves at most one question for Dad (its emails are never safe to repeat).

Most workers are forked from a pre-loaded Django (tests/support/forkserver.py) so the kills fit in a
minute; every 25th, and the last, is a plain `manage.py runloop` subprocess.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from loop.models import Effect, EffectState, Event, EventKind, Step, Task, Worker
from loop.tools.mail import message_id

from .conftest import make_task, process_env, start_runloop, step, wait_for
from .support.chaos_sinks import HttpSink, SmtpSink
from .support.forkserver import ForkServer
from .support.truth import Person

KILLS = int(os.environ.get("CHAOS_KILLS", "100"))  # per run
SEED = int(os.environ.get("CHAOS_SEED", str(random.randrange(1 << 30))))  # one for both runs
OPEN_TASKS = 8  # keep this many tasks unfinished: every kill lands on work, batches fill
MAX_LIFE = 0.3  # seconds a worker may live before its kill
HOLD_MS = 60  # the receivers hold an answer up to this long, so kills land mid-effect


class Chaos:
    """The plans, and the person answering questions as the sinks' truth demands."""

    def __init__(self, smtp: SmtpSink, web: HttpSink, rng: random.Random) -> None:
        self.smtp, self.web, self.rng = smtp, web, rng
        self.created = 0
        self.person = Person(web=web, smtp=smtp)

    def top_up(self) -> None:
        while Task.objects.exclude(state="done").count() < OPEN_TASKS:
            self.created += 1
            make_task(*self.plan(self.created), title=f"chaos {self.created}")

    def plan(self, n: int) -> list[dict[str, Any]]:
        def mark(key: str) -> str:
            return f"chaos {n}/{key}"

        def mail(key: str) -> dict[str, Any]:
            args = {"to": ["dad@example.com"], "subject": mark(key), "body": mark(key)}
            return step(key, "email.send", args=args, max_attempts=100)

        def post(key: str, hook: str) -> dict[str, Any]:
            args = {"url": self.web.url(hook), "json": {"marker": mark(key)}}
            return step(key, "http.post", args=args, max_attempts=100)

        middle = [
            mail("mail-1"),
            step("ping", "http.get", args={"url": self.web.url("/ping")}, max_attempts=100),
            post("post-probed", "/hook/probe"),  # the receiver can be asked about it
            post("post-other", "/hook/other"),  # the receiver can't tell: a person must
            mail("mail-2"),
        ]
        self.rng.shuffle(middle)
        path = f"chaos-{n}.txt"
        return [
            step("hello", args={"value": n}, max_attempts=100),
            *middle,
            step(
                "save", "file.write", args={"path": path, "content": mark("save")}, max_attempts=100
            ),
            step("read", "file.read", args={"path": path}, max_attempts=100),
        ]

    def settled(self) -> bool:
        """All sinks have read everything sent to them (checked twice, a moment apart)."""
        return all(s.idle() for s in (self.smtp, self.web)) and (
            time.sleep(0.01) or all(s.idle() for s in (self.smtp, self.web))
        )

    def answer_questions(self) -> None:
        self.person.answer_questions()

    def all_done(self) -> bool:
        self.person.answer_questions()
        return not Task.objects.exclude(state="done").exists()


def duplicates(counts: Counter[str]) -> int:
    return sum(n - 1 for n in counts.values() if n > 1)


def questions() -> list[tuple[str, str, str]]:
    """Every question asked: (kind, the step's tool, the worker whose start of the step came
    last before it). That worker's cut is what the question is about: the step's call went
    out, or may have, under that start."""
    asked = []
    starts = [EventKind.STEP_STARTED, EventKind.STEP_RESTARTED]
    for blocked in Event.objects.filter(kind=EventKind.STEP_BLOCKED).order_by("id"):
        start = (
            Event.objects.filter(step_id=blocked.step_id, kind__in=starts, id__lt=blocked.pk)
            .order_by("-id")
            .first()
        )
        assert start is not None, f"{blocked.step} asked a question before it ever started"
        asked.append((blocked.data["question"], blocked.step.tool, start.actor))
    return asked


@pytest.mark.slow
@pytest.mark.parametrize("listed", [True, False], ids=["receiver-listed", "receiver-not-listed"])
def test_no_side_effect_happens_twice_when_the_worker_is_killed_at_random(
    transactional_db: None, tmp_path: Path, processes: list[Any], listed: bool
) -> None:
    print(f"\nchaos seed {SEED} (CHAOS_SEED={SEED} repeats the plans and kill times)")
    rng = random.Random(SEED)
    db_path = process_env()["DATABASE_URL"]
    files = tmp_path / "files"
    files.mkdir()
    logs = tmp_path / "workers.log"
    with (
        SmtpSink(db_path=db_path, max_delay_ms=15) as smtp,
        HttpSink(db_path=db_path, max_delay_ms=HOLD_MS, dedupe=True) as web,
    ):
        env = process_env(
            LOOP_IDEMPOTENT_RECEIVERS=web.url("/hook/") if listed else "",
            EMAIL_HOST="127.0.0.1",
            EMAIL_PORT=str(smtp.port),
            EMAIL_TIMEOUT="10",
            LOOP_HTTP_PROBE_URL=web.url("/probe/{key}"),
            LOOP_HTTP_TIMEOUT="10",
            LOOP_FILE_ROOT=str(files),
            LOOP_IDLE_SLEEP_MS="20",
            LOOP_RETRY_BASE_SECONDS="0",
            LOOP_MIN_FREE_MB="0",
            LOOP_LOG_LEVEL="WARNING",
        )
        chaos = Chaos(smtp, web, rng)
        forks = ForkServer(env)
        kills = real_kills = 0
        try:
            while kills < KILLS:
                chaos.top_up()
                if kills % 25 == 24:  # now and then the plain command, start-up and all
                    proc = start_runloop(env=env, log=logs)
                    processes.append(proc)
                    wait_for(lambda p=proc: Worker.objects.filter(pid=p.pid).exists())
                    time.sleep(rng.uniform(0, MAX_LIFE))
                    os.kill(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=30)
                    real_kills += 1
                else:
                    pid = forks.spawn(logs)
                    time.sleep(rng.uniform(0, MAX_LIFE))
                    forks.kill(pid)
                kills += 1
                wait_for(chaos.settled)
                chaos.answer_questions()
            final = start_runloop(env=env, log=logs)  # the last worker runs everything out
            processes.append(final)
            wait_for(chaos.all_done, timeout=120, interval=0.2)
            final.send_signal(signal.SIGTERM)
            final.wait(timeout=30)
        finally:
            forks.close()

        mails, posts = smtp.record.counts(), web.record.counts()
        markers = Counter(d.body for d in smtp.record.deliveries) + Counter(
            d.body for d in web.record.deliveries
        )
        effects = list(Effect.objects.all())
        sent_once = [e for e in effects if e.tool in ("email.send", "http.post")]
        asked = questions()
        probed = Event.objects.filter(kind=EventKind.PROBE, data__found=True).count()
        steps_done = Step.objects.filter(state="done").count()
        replays = len(web.record.replays)
        per_worker = Counter(worker for _, _, worker in asked)
        by_kind = Counter(f"{kind} ({tool})" for kind, tool, _ in asked)
        table = [
            ("receiver", "listed in LOOP_IDEMPOTENT_RECEIVERS" if listed else "not listed"),
            ("kills", f"{kills} ({real_kills} of `manage.py runloop`)"),
            ("tasks, steps done", f"{chaos.created}, {steps_done}"),
            ("effects", " ".join(f"{k} {n}" for k, n in Counter(e.tool for e in effects).items())),
            ("questions", f"{len(asked)}: " + (", ".join(f"{k} {n}" for k, n in by_kind.items()))),
            ("most questions from one kill", max(per_worker.values(), default=0)),
            ("answers", dict(chaos.person.answers)),
            ("settled by probes", probed),
            ("deliveries", f"emails {sum(mails.values())}, posts {sum(posts.values())}"),
            ("POSTs sent again, answered by the receiver from its store", replays),
            ("duplicate actions", duplicates(mails) + duplicates(posts)),
        ]
        print("\n".join(f"  {name:<58} {value}" for name, value in table))

    assert not smtp.record.violations + web.record.violations
    assert duplicates(mails) == 0 and duplicates(posts) == 0
    assert duplicates(markers) == 0
    assert not Task.objects.exclude(state="done").exists()
    assert len(asked) == sum(chaos.person.asked.values())  # every question was seen and checked
    # One question per crash at most: a worker holds at most one call that would ask if cut.
    assert max(per_worker.values(), default=0) <= 1, per_worker.most_common(3)
    assert all(worker.startswith("worker:") for worker in per_worker)
    if listed:  # its POSTs settle themselves: a cut sends them again with the same key
        assert not [q for q in asked if q[1] == "http.post"], asked
    else:  # never sent twice without a person's "do it" (who is only asked when it did not go)
        assert replays == 0
    for effect in sent_once:
        key = message_id(effect.pk) if effect.tool == "email.send" else effect.pk
        assert effect.state == EffectState.SUCCEEDED, effect
        assert (mails if effect.tool == "email.send" else posts)[key] == 1, effect
    assert all(e.state == EffectState.SUCCEEDED for e in effects)
