"""Shared helpers: named personas, small plan builders, an in-process worker, and real
`runloop` processes on the test database file."""

from __future__ import annotations

import compileall
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import Permission, User
from django.db import connection, transaction

from loop import actions, lease, plans, step_life
from loop.models import Task
from loop.permissions import SYSTEM
from loop.step_life import Started
from loop.worker import Worker

from .support.llm_server import ModelServer
from .support.loopapp import tools as _test_tools  # noqa: F401  registers test.record, test.flaky here

ROOT = Path(__file__).resolve().parent.parent


def pytest_sessionstart(session: pytest.Session) -> None:
    """Byte-compile the project's own modules once, before any child `manage.py` starts.

    Where PYTHONDONTWRITEBYTECODE is set (as on this workplace's machines and CI) no process
    writes a .pyc, so every child compiled loop/, pippa_site/ and the test apps from source
    again: about 0.3 s of CPU per child, and the suite starts hundreds. compileall writes them
    whatever that variable says; a .pyc whose source changed since is ignored as usual."""
    for folder in ("loop", "pippa_site", "tests"):
        compileall.compile_dir(ROOT / folder, quiet=2)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The suite runs twice, on SQLite and on PostgreSQL + Redis; a test marked `sqlite_only`
    proves nothing a database changes (a pure function, a page's look, the sandbox), so it runs
    on the first run only and keeps the second one short."""
    if not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        return
    skip = pytest.mark.skip(reason="database-independent: tried on the SQLite run")
    for item in items:
        if item.get_closest_marker("sqlite_only"):
            item.add_marker(skip)


# The tests' receivers (tests/support/sinks.py, the canned servers) listen on 127.0.0.1, which
# the http tools refuse unless the operator lists it (loop/tools/room.py): the tests list it,
# for this process and every child it starts. tests/test_http_deny.py takes it away again.
RECEIVERS_HERE = "127.0.0.1"


@pytest.fixture(scope="session", autouse=True)
def _receivers_on_loopback() -> Iterator[None]:
    from django.test import override_settings

    os.environ["LOOP_HTTP_ALLOW"] = RECEIVERS_HERE
    with override_settings(LOOP_HTTP_ALLOW=[RECEIVERS_HERE]):
        yield


def step(key: str, tool: str = "echo", **fields: Any) -> dict[str, Any]:
    args = fields.pop("args", {"value": key} if tool == "echo" else {})
    return {"key": key, "tool": tool, "args": args, **fields}


def make_task(
    *steps: dict[str, Any], title: str = "test task", actor: str = "test", driver: str = ""
) -> Task:
    """A task a person wrote (the operator at the shell); given to the agent `driver` to drive
    over the API, if named."""
    spec = plans.validate({"title": title, "steps": list(steps)})
    task = actions.create_task(plan=spec, actor=actor, user=SYSTEM)
    if driver:
        task = actions.give(task_id=task.pk, agent=driver, actor=actor, user=SYSTEM)
    return task


@pytest.fixture
def worker(db: None) -> Worker:
    """A booted in-process worker; call .tick() to run one pass."""
    runner = Worker(label="test")
    runner.boot()
    return runner


def claim_and_start(runner: Worker) -> Started:
    """What a tick does first, alone: claim a task and start its first open step (one commit)."""
    with transaction.atomic():
        claimed = lease.claim(runner.worker_id)
        assert claimed is not None
        started = step_life.begin_one(claimed[0], runner.holding(claimed[1]))
    assert isinstance(started, Started), started
    return started


def run_until_idle(runner: Worker, limit: int = 200) -> int:
    ticks = 0
    while runner.tick():
        ticks += 1
        assert ticks < limit, "the loop did not settle"
    return ticks


DAD_PERMISSIONS = ("loop.confirm_step", "loop.add_task", "loop.change_step", "loop.add_message")


def permission_objects(*names: str) -> list[Permission]:
    """The Permission rows for names like 'loop.confirm_step'."""
    found = []
    for name in names:
        app, codename = name.split(".")
        found.append(Permission.objects.get(content_type__app_label=app, codename=codename))
    return found


@pytest.fixture
def dad(db: None) -> User:
    """Dad holds every permission the loop asks for (loop/permissions.py)."""
    user = User.objects.create_user("dad", password="dad-password-1")
    user.user_permissions.add(*permission_objects(*DAD_PERMISSIONS))
    return User.objects.get(pk=user.pk)  # fresh permission cache


@pytest.fixture
def guest(db: None) -> User:
    return User.objects.create_user("guest", password="guest-password-1")


@pytest.fixture
def file_root(tmp_path: Path, settings: Any) -> Path:
    root = tmp_path / "files"
    root.mkdir()
    settings.LOOP_FILE_ROOT = str(root)
    return root


# ---- real processes --------------------------------------------------------------------------


def process_env(**extra: str) -> dict[str, str]:
    """Environment for a child `manage.py` on the same (test) database as this test."""
    db = connection.settings_dict
    env = dict(os.environ)
    if connection.vendor == "sqlite":
        env["DATABASE_URL"] = f"sqlite:///{db['NAME']}"
    else:
        env["DATABASE_URL"] = (
            f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
        )
    env["PIPPA_DATA_DIR"] = str(Path(settings.DATA_DIR))
    env["PYTHONUNBUFFERED"] = "1"
    env["PIPPA_EXTRA_APPS"] = "tests.support.loopapp"  # the children load the test tools too
    env.update(extra)
    return env


def manage(*args: str, env: dict[str, str] | None = None, check: bool = True) -> str:
    result = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        capture_output=True,
        text=True,
        env=env or process_env(),
        timeout=120,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"manage.py {' '.join(args)} failed:\n{result.stderr}")
    return result.stdout


def start_runloop(
    *args: str, env: dict[str, str] | None = None, log: Path | None = None
) -> subprocess.Popen[bytes]:
    out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115
    return subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "runloop", *args],
        env=env or process_env(),
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def task_json(task_id: int, env: dict[str, str] | None = None) -> dict[str, Any]:
    return json.loads(manage("task", str(task_id), "--json", env=env))


def wait_for(predicate: Any, timeout: float = 60.0, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {predicate}")


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Collects child processes and SIGKILLs whatever is left at the end of the test."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        kill(proc)


@pytest.fixture(scope="session", autouse=True)
def _no_stray_database_sessions(django_db_setup: None, django_db_blocker: Any) -> Iterator[None]:
    """On PostgreSQL the test database is dropped at the end; sessions that children (daphne,
    runloop) or channels' worker threads left behind would make that fail. End them first."""
    yield
    with django_db_blocker.unblock():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )


@pytest.fixture(autouse=True)
def _fresh_clock() -> None:
    """Each test measures this host's clock against the database's afresh (loop/clock.py): a
    test that moved this process's clock leaves no skew behind."""
    from loop import clock

    clock.forget()


@pytest.fixture(autouse=True)
def _fresh_throttles() -> None:
    """Each test counts failed logins and wrong agent tokens from zero (loop/throttle.py)."""
    from django.core.cache import caches

    if settings.REDIS_URL:  # only the throttle's keys: the channel layer shares the database
        import redis

        client = redis.Redis.from_url(settings.REDIS_URL)
        keys = list(client.scan_iter(match="pippa-throttle:*"))
        if keys:
            client.delete(*keys)
        client.close()
    else:
        caches["throttle"].clear()
    caches["throttle-local"].clear()  # where the counts go while Redis does not answer


# ---- the model judge: a scripted OpenAI-compatible server ---------------------------------


@pytest.fixture
def llm(settings: Any) -> Iterator[Any]:
    """Point the loop at a scripted server (tests/support/llm_server.py): `llm(script)`
    starts it; until then the loop points at a port nobody answers."""
    servers: list[ModelServer] = []

    def start(script: Any) -> ModelServer:
        server = ModelServer(script).__enter__()
        servers.append(server)
        settings.LOOP_LLM_BASE_URL = server.base_url
        return server

    settings.LOOP_LLM_BASE_URL = "http://127.0.0.1:9/v1"
    settings.LOOP_LLM_RETRY_SECONDS = 3
    settings.LOOP_RETRY_BASE_SECONDS = 0
    yield start
    for server in servers:
        server.__exit__()
    from loop import llm as client

    client._mark_up()  # an outage this test caused parks no later test's worker


def model_env(model: ModelServer, **extra: str) -> dict[str, str]:
    """A child `runloop`'s environment, pointed at the scripted server `model`."""
    return process_env(
        LOOP_LLM_BASE_URL=model.base_url,
        LOOP_LLM_RETRY_SECONDS="5",
        LOOP_IDLE_SLEEP_MS="20",
        LOOP_RETRY_BASE_SECONDS="0",
        **extra,
    )
