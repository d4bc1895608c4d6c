"""The nemesis (tests/test_nemesis.py, bench/nemesis.py): the loop on PostgreSQL with three
real workers — one on this host, two each in a network namespace of its own (`ip netns`, a
veth pair, 198.18.N.0/30: the range set aside for benchmarks) and a pid namespace of its own
(`unshare --pid`, so only heartbeats tell whether they live) — under a random schedule of
faults, one at a time:

    partition   a namespaced worker cut off from everything (its veth's host end down)
    pause       a worker SIGSTOPped, then SIGCONTed
    clock       one worker of the run runs its whole life with its clock off (libfaketime)
    db-outage   every worker's database connections cut and new ones refused (the forwarder
                they reach PostgreSQL through: a restart as they see it, the server untouched)
    pg-restart  PostgreSQL really restarted (`restarts=True`: the bench, on servers of its own)
    redis       Redis really restarted (`restarts=True`; the workers are given REDIS_URL as an
                operator's would be: it carries the web servers' live updates and login
                counts, and the loop keeps nothing there, so the run shows it does not care)

Each task is an `echo`, a POST the receiver can be asked about and one it cannot tell about
(a person must answer), to a receiver recording every arrival. A person answers each question
from that record while the run goes on. Afterwards, each run is checked:

    duplicates      an effect that arrived twice with no "it did not happen — do it" between
    double holds    a step on which two holders both had a verdict accepted: a verdict that
                    landed after another worker started the step (the journal)
    questions       each one's holder must have been under a fault while it held the step:
                    else the question was not needed (a live worker taken for dead)
    stuck           a task neither done nor waiting on Dad once the faults are over

Faults are recorded as windows of journal ids (the database's sequence: no host clock enters),
per worker slot, or for all of them.
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

from django.db import connections
from django.db.models import Max

from loop import actions, plans
from loop.models import Event, EventKind, Task, Worker
from loop.permissions import SYSTEM

from .chaos_scale import STARTS
from .chaos_sinks import HttpSink, free_port
from .servers import SHARED, Servers, restart_postgres, restart_redis, sh
from .skew import skewed
from .truth import Person

ROOT = Path(__file__).resolve().parents[2]


def last_event() -> int:
    return int(Event.objects.aggregate(top=Max("id"))["top"] or 0)


# ---- the network ---------------------------------------------------------------------------


class Network:
    """Two network namespaces, each joined to this one by a veth pair; each namespace reaches
    this one's addresses through its default route."""

    def __init__(self, tag: str) -> None:
        self.tag = tag  # short and unique: interface names have 15 characters at most
        self.spaces = [f"{tag}n{n}" for n in (1, 2)]
        self.links = [f"{tag}v{n}" for n in (1, 2)]
        self.hosts = [f"198.18.{200 + n}.1" for n in (1, 2)]

    def __enter__(self) -> Network:
        for space, link, host in zip(self.spaces, self.links, self.hosts, strict=True):
            inner = host.rsplit(".", 1)[0] + ".2"
            for command in (
                f"ip netns add {space}",
                f"ip -n {space} link set lo up",
                f"ip link add {link} type veth peer name {link}p",
                f"ip link set {link}p netns {space}",
                f"ip addr add {host}/30 dev {link}",
                f"ip link set {link} up",
                f"ip -n {space} addr add {inner}/30 dev {link}p",
                f"ip -n {space} link set {link}p up",
                f"ip -n {space} route add default via {host}",
            ):
                sh(command)
        return self

    def __exit__(self, *exc: object) -> None:
        for space, link in zip(self.spaces, self.links, strict=True):
            sh(f"ip link del {link}", check=False)
            sh(f"ip netns del {space}", check=False)

    def cut(self, n: int) -> None:
        sh(f"ip link set {self.links[n]} down")

    def heal(self, n: int) -> None:
        sh(f"ip link set {self.links[n]} up")


# ---- the run -------------------------------------------------------------------------------


@dataclass
class Fault:
    kind: str
    slot: int | None  # None: every worker
    since: int  # journal ids
    until: int = 0
    seconds: float = 0.0


@dataclass
class Run:
    seed: int
    faults: list[Fault] = field(default_factory=list)
    skew: tuple[int, float] = (0, 0.0)  # the slot whose clock is off, by how much
    duplicates: list[str] = field(default_factory=list)
    late_sends: int = 0  # a send after a person's "do it" for a call that then arrived late
    double_holds: list[str] = field(default_factory=list)
    questions: Counter[str] = field(default_factory=Counter)
    unneeded: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)  # the person's checks that failed
    deliveries: int = 0
    steps_done: int = 0
    seconds: float = 0.0

    @property
    def fault_counts(self) -> Counter[str]:
        return Counter(f.kind for f in self.faults)

    @property
    def ok(self) -> bool:
        return not (
            self.duplicates or self.double_holds or self.unneeded or self.stuck or self.wrong
        )


class Nemesis:
    """One run's workers and faults, on the database Django is set up on (the test's, the
    bench's), through a forwarder on `forward_port`."""

    def __init__(
        self,
        env: dict[str, str],
        net: Network,
        web: HttpSink,
        log: Path,
        *,
        restarts: bool = False,
        servers: Servers = SHARED,
    ) -> None:
        self.env, self.net, self.web, self.log = env, net, web, log
        self.restarts, self.servers = restarts, servers
        self.control = log.with_suffix(".db")
        self.control.write_text("up")
        self.port = free_port()
        self.forwarder = subprocess.Popen(
            [
                *(sys.executable, "-m", "tests.support.forward", str(self.port)),
                *("127.0.0.1", env["NEMESIS_PG_PORT"], str(self.control)),
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        assert self.forwarder.stdout is not None
        assert self.forwarder.stdout.readline().strip() == b"ready"
        self.procs: list[subprocess.Popen[bytes] | None] = [None, None, None]

    def close(self) -> None:
        for n in range(3):
            self.stop(n)
        self.forwarder.kill()
        self.forwarder.wait()

    # -- workers

    def worker_env(self, slot: int, skew: float) -> dict[str, str]:
        host = "127.0.0.1" if slot == 0 else self.net.hosts[slot - 1]
        url = self.env["NEMESIS_DATABASE_URL"].format(host=host, port=self.port)
        env = {**self.env, "DATABASE_URL": url}
        if "NEMESIS_REDIS_URL" in self.env:  # the channel layer, where this worker reaches it
            env["REDIS_URL"] = self.env["NEMESIS_REDIS_URL"].format(host=host)
        return skewed(env, skew) if skew else env

    def start(self, slot: int, skew: float) -> None:
        command = [sys.executable, str(ROOT / "manage.py"), "runloop", "--worker-id", f"nem-{slot}"]
        if slot:
            space = self.net.spaces[slot - 1]
            own_pids = ("unshare", "--pid", "--fork", "--mount-proc", "--kill-child")
            command = ["ip", "netns", "exec", space, *own_pids, *command]
        with self.log.open("ab") as out:
            self.procs[slot] = subprocess.Popen(
                command,
                env=self.worker_env(slot, skew),
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def signal(self, slot: int, sig: int) -> None:
        proc = self.procs[slot]
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, sig)

    def stop(self, slot: int) -> None:
        proc = self.procs[slot]
        if proc is None:
            return
        self.signal(slot, signal.SIGCONT)
        self.signal(slot, signal.SIGKILL)
        proc.wait(timeout=30)
        self.procs[slot] = None

    # -- faults

    def fault(self, rng: random.Random, run: Run) -> None:
        """One fault, chosen and timed by `rng`, held for its time and then healed."""
        kinds = ["partition", "pause", "db-outage"] + (
            ["pg-restart", "redis"] if self.restarts else []
        )
        kind = rng.choice(kinds)
        seconds = round(
            rng.uniform(1, 5) if kind in ("partition", "pause") else rng.uniform(1, 3), 2
        )
        slot = (
            rng.choice([1, 2])
            if kind == "partition"
            else rng.randrange(3)
            if kind == "pause"
            else None
        )
        fault = Fault(kind, slot, since=last_event(), seconds=seconds)
        run.faults.append(fault)
        if kind == "partition":
            assert slot is not None
            self.net.cut(slot - 1)
            try:
                time.sleep(seconds)
            finally:
                self.net.heal(slot - 1)
        elif kind == "pause":
            assert slot is not None
            self.signal(slot, signal.SIGSTOP)
            try:
                time.sleep(seconds)
            finally:
                self.signal(slot, signal.SIGCONT)
        elif kind == "db-outage":
            self.control.write_text("down")
            try:
                time.sleep(seconds)
            finally:
                self.control.write_text("up")
        elif kind == "pg-restart":
            restart_postgres(self.servers, seconds)
            connections.close_all()  # this process's own session ended too: a new one
        else:
            restart_redis(self.servers, seconds)
        fault.until = last_event()


def plan(n: int, web: HttpSink) -> dict[str, Any]:
    def post(key: str, hook: str) -> dict[str, Any]:
        args = {"url": web.url(hook), "json": {"marker": f"nemesis {n}/{key}"}}
        return {"key": key, "tool": "http.post", "args": args, "max_attempts": 100}

    steps = [
        {"key": "look", "tool": "echo", "args": {"value": n}},
        post("post-probed", "/hook/probe"),
        post("post-other", "/hook/other"),
    ]
    return {"title": f"nemesis {n}", "steps": steps}


def one_run(
    nemesis: Nemesis,
    *,
    seed: int,
    tasks: int,
    fault_seconds: float,
    settle_seconds: float = 90,
) -> Run:
    """Workers up (one with its clock off), tasks in, faults for `fault_seconds` (one at a
    time, a second or two apart), everything healed, the tasks finished with a person
    answering; then the checks. The database must be empty of tasks when it starts."""
    rng = random.Random(seed)
    run = Run(seed)
    began = time.monotonic()
    skew_slot, skew = rng.randrange(3), rng.choice([-1, 1]) * round(rng.uniform(5, 30), 1)
    run.skew = (skew_slot, skew)
    person = Person(web=nemesis.web)
    first_event = last_event()
    for slot in range(3):
        nemesis.start(slot, skew if slot == skew_slot else 0.0)
    try:
        _wait(
            lambda: Worker.objects.filter(state="running", label__startswith="nem-").count() >= 3,
            60,
        )
        created = 0

        def more(count: int) -> None:  # tasks come in through the faults, so faults cut work
            nonlocal created
            for _ in range(min(count, tasks - created)):
                spec = plans.validate(plan(created, nemesis.web))
                actions.create_task(plan=spec, actor="nemesis", user=SYSTEM)
                created += 1

        more(3)
        ends = time.monotonic() + fault_seconds
        while time.monotonic() < ends:
            _answer(person, run)
            more(2)
            time.sleep(rng.uniform(0.3, 1.0))
            nemesis.fault(rng, run)
        more(tasks)
        deadline = time.monotonic() + settle_seconds
        while time.monotonic() < deadline:
            _answer(person, run)
            if not Task.objects.open().exists():
                break
            time.sleep(0.2)
    finally:
        run.seconds = time.monotonic() - began
        for slot in range(3):
            nemesis.stop(slot)
    check(run, nemesis, person, first_event)
    return run


def _wait(predicate: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("the workers did not start")
        time.sleep(0.1)


def _answer(person: Person, run: Run) -> None:
    try:
        person.answer_questions()
    except AssertionError as exc:  # a question the truth says should not have been asked
        said = str(exc).splitlines()[0][:300]
        if said not in run.wrong:  # the same question, seen again at the next look
            run.wrong.append(said)


def check(run: Run, nemesis: Nemesis, person: Person, first_event: int) -> None:
    run.questions = Counter(person.asked)
    arrivals = Counter(d.key for d in nemesis.web.record.deliveries)
    run.deliveries = sum(arrivals.values())
    reruns = set(
        Event.objects.filter(
            kind=EventKind.EFFECT_STATE, data__old="uncertain", data__new="pending"
        ).values_list("effect_id", flat=True)
    )
    for key, count in arrivals.items():
        if count > 1:
            if key in reruns:
                run.late_sends += count - 1
            else:
                run.duplicates.append(f"effect {key} arrived {count} times, no 'do it' between")
    run.double_holds = double_holds(first_event)
    run.steps_done = Event.objects.filter(kind=EventKind.STEP_DONE, id__gt=first_event).count()
    run.stuck = [f"{t} is {t.state}" for t in Task.objects.open().exclude(state="blocked")]
    run.unneeded = unneeded_questions(run, first_event)


VERDICTS = {EventKind.STEP_DONE, EventKind.STEP_RETRY, EventKind.STEP_FAILED}


def double_holds(first_event: int) -> list[str]:
    """Steps two holders both had a verdict accepted on: a worker's verdict that landed
    although another worker started the step after it did. (A lease that ran out lets another
    worker take the step with no death or release journaled between — a paused or cut-off
    holder — so the chaos check's `overlaps` would flag every such takeover; what must never
    happen is the old holder's verdict landing after it: the fence refuses it, `late_result`.)
    A question asked at a step's start is no verdict of a start, and the question checks
    cover it."""
    last_start: dict[int, str] = {}
    found = []
    rows = Event.objects.filter(id__gt=first_event, kind__in=[*STARTS, *VERDICTS]).order_by("id")
    for at, kind, step, actor in rows.values_list("id", "kind", "step_id", "actor").iterator():
        if kind in STARTS:
            last_start[step] = actor
        elif actor.startswith("worker:") and last_start.get(step, actor) != actor:
            found.append(
                f"step {step}: {actor}'s {kind} landed at event {at} after {last_start[step]} started it"
            )
    return found


def unneeded_questions(run: Run, first_event: int) -> list[str]:
    """Each question whose holder — the worker whose start of the step came last before the
    step blocked — was under no fault while it held the step: a live, reachable worker whose
    work was taken from it."""
    slots = {
        f"worker:{pk}": int(label.removeprefix("nem-"))
        for pk, label in Worker.objects.filter(label__startswith="nem-").values_list("pk", "label")
    }
    last_start: dict[int, tuple[str, int]] = {}
    found = []
    rows = Event.objects.filter(
        id__gt=first_event, kind__in=[*STARTS, EventKind.STEP_BLOCKED]
    ).order_by("id")
    for at, kind, step, actor in rows.values_list("id", "kind", "step_id", "actor").iterator():
        if kind in STARTS:
            last_start[step] = (actor, at)
            continue
        holder, since = last_start.get(step, ("", 0))
        slot = slots.get(holder)
        hit = any(
            (f.slot is None or f.slot == slot) and f.since <= at and since <= (f.until or at)
            for f in run.faults
        )
        if not hit:
            found.append(
                f"step {step} asked at event {at}: its holder {holder} (slot {slot}) had no fault"
            )
    return found


# ---- the table -----------------------------------------------------------------------------


def table(runs: list[Run]) -> str:
    header = (
        "run  seed        skew       faults                                  "
        "dup  double  questions  unneeded  stuck  late-sends  wrong  steps  s"
    )
    lines = [header, "-" * len(header)]
    for n, run in enumerate(runs, 1):
        faults = ", ".join(f"{k} {c}" for k, c in sorted(run.fault_counts.items()))
        lines.append(
            f"{n:<4} {run.seed:<11} {f'w{run.skew[0]} {run.skew[1]:+.0f}s':<10} {faults:<39} "
            f"{len(run.duplicates):<4} {len(run.double_holds):<7} {sum(run.questions.values()):<10} "
            f"{len(run.unneeded):<9} {len(run.stuck):<6} {run.late_sends:<11} {len(run.wrong):<6} "
            f"{run.steps_done:<6} {run.seconds:.0f}"
        )
    total = Counter[str]()
    for run in runs:
        total.update(run.fault_counts)
    lines.append("-" * len(header))
    lines.append(
        f"all  {len(runs)} runs; faults: {', '.join(f'{k} {c}' for k, c in sorted(total.items()))}; "
        f"duplicates {sum(len(r.duplicates) for r in runs)}, double holds "
        f"{sum(len(r.double_holds) for r in runs)}, questions {sum(sum(r.questions.values()) for r in runs)}, "
        f"unneeded {sum(len(r.unneeded) for r in runs)}, stuck {sum(len(r.stuck) for r in runs)}, "
        f"late sends {sum(r.late_sends for r in runs)}, wrong {sum(len(r.wrong) for r in runs)}"
    )
    return "\n".join(lines)
