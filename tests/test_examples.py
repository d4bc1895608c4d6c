"""Every plan in examples/ runs as it is, through the loop, against `manage.py demo_receiver`
on its port (8025), as the README's first five minutes tell a new user to run them: the
payment asks first and is paid once, the chat gets its message, the schedule makes its task."""

from __future__ import annotations

import io
import re
import socket
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import call_command
from django.utils import timezone

from loop import actions, schedules
from loop.models import Schedule, Step, Task
from loop.permissions import SYSTEM
from loop.worker import Worker

from .conftest import ROOT, kill, process_env, run_until_idle, wait_for

pytestmark = pytest.mark.sqlite_only
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
DEMO_PORT = 8025


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_every_example_runs_as_it_is_against_the_demo_receiver(
    transactional_db: None, processes: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    assert {p.name for p in EXAMPLES} >= {"hello.yaml", "pay-the-plumber.yaml"}
    assert not listening(DEMO_PORT), f"port {DEMO_PORT} is taken: the demo receiver needs it"
    log = tmp_path / "demo.log"
    receiver = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "demo_receiver"],
        env=process_env(),
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    processes.append(receiver)
    wait_for(lambda: listening(DEMO_PORT), timeout=30)

    made = {}
    for path in EXAMPLES:
        out = io.StringIO()
        call_command("plan", str(path), stdout=out)
        made[path.name] = out.getvalue().strip()
    # The schedule: due now, so it makes its task at once.
    [schedule] = Schedule.objects.all()
    Schedule.objects.filter(pk=schedule.pk).update(next_due=timezone.now() - timedelta(minutes=1))
    [run] = schedules.fire_due(actor="test")

    runner = Worker(label="examples")
    runner.boot()
    run_until_idle(runner)
    pay = Step.objects.get(key="pay")
    assert pay.state == "blocked" and pay.question_kind == "may_i"  # it asks first
    actions.unblock(step_id=pay.pk, decision="allow", actor="dad", user=SYSTEM)
    run_until_idle(runner)

    tasks = Task.objects.all()
    assert len(tasks) == len(EXAMPLES)
    assert {t.title: t.state for t in tasks} == {t.title: "done" for t in tasks}
    assert Step.objects.get(key="pay").output["body"] == {"paid": 120, "receipt": "R-1"}
    assert run.tasks.get().state == "done"
    kill(receiver)
    said = log.read_text()
    assert "POST /pay 120: paid R-1" in said and said.count("POST /pay") == 1
    assert "POST /messages: Today in Berlin: sunny" in said
    assert "POST /messages: Good morning! Berlin: sunny" in said


def test_the_readme_starts_with_the_two_commands_and_links_only_what_the_repository_has() -> None:
    readme = (ROOT / "README.md").read_text()
    assert readme.startswith("# Pippa Loop\n\n```sh\nbin/up     #"), readme[:80]
    assert readme.split("```")[1].strip().splitlines()[2].startswith("bin/test   #")
    assert "DESIGN.md" not in readme  # the design is in docs/, in the repository
    targets = re.findall(r"\]\(([^)#]+)[^)]*\)|src=\"([^\"]+)\"", readme)
    linked = {a or b for a, b in targets if not (a or b).startswith("http")}
    assert {"docs/architecture.md", "examples/", "docs/img/home-desk.png"} <= linked, linked
    for path in linked:
        assert (ROOT / path).exists(), f"README links {path}, which is not in the repository"
