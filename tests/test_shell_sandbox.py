"""shell.run runs in a sandbox (DESIGN.md §19, loop/tools/sandbox.py), tried from inside as the
plan author who read Django's SECRET_KEY with `head -c 12 var/secret_key` would try it.

Most tests call the real tool as the outbox does (its function, with an effect id) and touch no
database; the sandbox does not depend on which one the loop uses, so they run on the SQLite run
of the suite only. Those that run a plan (an in-process worker, a real `manage.py runloop`) run
on both. The machine must have a working sandbox (bin/install installs bubblewrap and makes its
user): a test that finds none fails with the reason, it does not skip.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.db import connection

from loop import plans, tools
from loop.models import Step
from loop.outcomes import EffectRejected, EffectUncertainError
from loop.tools import sandbox
from loop.worker import Worker

from .conftest import ROOT, make_task, manage, process_env, run_until_idle, step

EFFECT_ID = "e" * 64

# The sandbox is the same whatever the database: tried once, on the SQLite run.
once = pytest.mark.skipif(
    "connection.vendor != 'sqlite'", reason="database-independent: tried on the SQLite run"
)

Shell = Callable[..., dict[str, Any]]


@pytest.fixture
def shell(settings: Any, file_root: Path) -> Shell:
    """shell.run on, in the file root of this test; `shell(*argv, **args)` calls the tool."""
    settings.LOOP_SHELL_ENABLED = True
    reason = tools.get("shell.run").disabled()
    assert reason is None, reason

    def call(*argv: str, **args: Any) -> dict[str, Any]:
        return tools.get("shell.run").run({"argv": list(argv), **args}, EFFECT_ID)

    return call


def running(needle: str) -> list[int]:
    """Pids on the host whose command line holds `needle`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            if needle.encode() in command:
                found.append(int(entry.name))
    return found


def processes_of(uid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and entry.stat().st_uid == uid:
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def sandbox_uid() -> int:
    found = sandbox.owner(django_settings.LOOP_SHELL_USER)
    assert found is not None, "no sandbox user: bin/install makes it"
    return found[0]


# ---- what it can see and write ---------------------------------------------------------------

SEEN = 'for p in "$@"; do ls -d "$p" >/dev/null 2>&1 && echo "seen $p"; done; head -c 12 "$1"'


@once
def test_the_secret_key_the_database_and_the_data_folder_are_out_of_sight(
    db: None, shell: Shell
) -> None:
    data = Path(django_settings.DATA_DIR)
    secret = data / "secret_key"
    database = Path(django_settings.DATABASES["default"]["NAME"])
    targets = [
        secret,
        database,
        data,
        ROOT / "manage.py",
        Path("/root"),
        Path(f"/proc/{os.getpid()}"),
    ]
    targets.append(Path("/var/run/postgresql"))  # the database server's socket
    present = [t for t in targets if t.exists()]
    assert secret in present and database in present  # the attack has something to aim at
    out = shell("sh", "-c", SEEN, "sh", *map(str, present))
    assert out["stdout"] == ""
    assert "No such file or directory" in out["stderr"]
    assert django_settings.SECRET_KEY[:12] not in json.dumps(out)


@once
def test_a_data_folder_under_usr_is_covered(shell: Shell) -> None:
    """Wherever the data folder or the checkout lies, even under a folder the sandbox shows
    (an install in /usr/local), it shows empty."""
    folder = Path("/usr/share/doc")
    assert any(folder.iterdir())
    room = dataclasses.replace(sandbox.Room.configured(), hidden=(folder,))
    ran = sandbox.run(room, sandbox.Command(("ls", "-A", str(folder)), timeout=10))
    assert (ran.returncode, ran.stdout.kept) == (0, b"")
    shown = sandbox.run(sandbox.Room.configured(), sandbox.Command(("ls", str(folder))))
    assert shown.stdout.kept != b""


@once
def test_it_writes_in_the_file_root_and_nowhere_else(
    shell: Shell, file_root: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "beside-the-root"
    in_data = Path(django_settings.DATA_DIR) / "planted"
    tries = [outside, in_data, Path("/usr/planted"), Path("/etc/planted"), Path("/planted")]
    script = 'echo in > inside.txt; for p in "$@"; do (echo x > "$p") 2>/dev/null && echo "wrote $p"; done; true'
    out = shell("sh", "-c", script, "sh", *map(str, tries), "/files/../planted")
    assert out["stdout"] == "" and out["returncode"] == 0
    assert (file_root / "inside.txt").read_text() == "in\n"
    assert (file_root / "inside.txt").stat().st_uid == sandbox_uid()
    assert not outside.exists() and not in_data.exists() and not Path("/planted").exists()
    # /tmp is its own, and gone when the command ends.
    mark = f"pippa-mark-{random.randrange(10**9)}"
    assert shell("sh", "-c", f"touch /tmp/{mark} && ls /tmp")["stdout"] == f"{mark}\n"
    assert shell("ls", "-A", "/tmp")["stdout"] == ""
    assert not Path("/tmp", mark).exists()


@once
def test_a_link_a_command_plants_does_not_steer_the_loops_own_writes(
    shell: Shell, file_root: Path, tmp_path: Path
) -> None:
    """file.write runs as root beside the sandbox's files: a link a command left where the
    write puts its temporary file (its name follows from the effect id) is not written
    through."""
    victim = tmp_path / "victim"
    victim.write_text("the host's own")
    effect_id = "f" * 64
    shell("ln", "-s", str(victim), f".out.txt.{effect_id[:16]}.tmp")
    tools.get("file.write").run({"path": "out.txt", "content": "the plan's"}, effect_id)
    assert victim.read_text() == "the host's own"
    written = file_root / "out.txt"
    assert not written.is_symlink() and written.read_text() == "the plan's"
    assert written.stat().st_uid == sandbox_uid()  # and the sandbox may change it


@once
def test_the_environment_is_the_sandboxs_own_and_its_user_is_not_root(
    shell: Shell, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgres://leak:leak@127.0.0.1/leak")
    monkeypatch.setenv("SECRET_KEY", "leaked-secret-key")
    monkeypatch.setenv("LOOP_LLM_API_KEY", "leaked-api-key")
    env = dict(line.split("=", 1) for line in shell("env")["stdout"].splitlines())
    assert env == {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": "/files",
        "LANG": "C.UTF-8",
        "PIPPA_EFFECT_ID": EFFECT_ID,
        "PWD": "/files",  # bwrap's, for the folder it starts in
    }
    assert shell("id", "-u")["stdout"] == f"{sandbox_uid()}\n" != "0\n"


# ---- time, processes, output -----------------------------------------------------------------


@once
def test_a_detached_child_is_killed_with_the_command_at_its_timeout(
    shell: Shell, file_root: Path
) -> None:
    marker = f"{40 + random.random():.6f}"  # a sleep nobody else runs
    started = time.monotonic()
    with pytest.raises(EffectUncertainError, match="past its timeout of 1s"):
        shell("sh", "-c", f"setsid sleep {marker} & touch detached; sleep 30", timeout=1)
    assert time.monotonic() - started < 3
    assert (file_root / "detached").exists() and running(f"sleep {marker}") == []
    # One that leaves a detached child and exits at once: the child goes with it.
    out = shell("sh", "-c", f"setsid sleep {marker} >/dev/null 2>&1 & echo left")
    assert out["stdout"] == "left\n"
    deadline = time.monotonic() + 1
    while running(f"sleep {marker}") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert running(f"sleep {marker}") == []


@once
def test_a_fork_bomb_is_bounded(shell: Shell, settings: Any) -> None:
    settings.LOOP_SHELL_PROCESSES = 32
    started = time.monotonic()
    out = shell("sh", "-c", "b() { b | b & }; b; sleep 1; echo standing", timeout=10)
    assert time.monotonic() - started < 10  # it ended by itself: the bomb ran out of forks
    assert "standing" in out["stdout"] and "Cannot fork" in out["stderr"]
    assert processes_of(sandbox_uid()) == []


@once
def test_its_limits_are_the_settings(shell: Shell, settings: Any, file_root: Path) -> None:
    settings.LOOP_SHELL_PROCESSES = 50
    settings.LOOP_SHELL_FILE_MB = 1
    settings.LOOP_SHELL_MEMORY_MB = 256
    limits = shell("cat", "/proc/self/limits", timeout=7)["stdout"]
    table = {line[:26].strip(): line[26:].split()[:2] for line in limits.splitlines()[1:]}
    assert table["Max processes"] == ["50", "50"]
    assert table["Max cpu time"] == ["8", "8"]  # the timeout, rounded up, and a second
    assert table["Max file size"] == [str(1 << 20)] * 2
    assert table["Max address space"] == [str(256 << 20)] * 2
    assert table["Max core file size"] == ["0", "0"]
    big = shell("sh", "-c", "head -c 3000000 /dev/zero > big")
    assert big["returncode"] != 0 and (file_root / "big").stat().st_size == 1 << 20
    greedy = shell("python3", "-c", "bytearray(300 << 20)")
    assert greedy["returncode"] == 1 and "MemoryError" in greedy["stderr"]


@once
def test_output_beyond_the_bound_is_cut_and_says_so(shell: Shell, settings: Any) -> None:
    settings.LOOP_SHELL_OUTPUT_BYTES = 1000
    out = shell(
        "sh", "-c", "head -c 5000 /dev/zero | tr '\\0' a; head -c 3000 /dev/zero | tr '\\0' b >&2"
    )
    note = "\n… (cut: {} bytes written, the first 1000 kept; LOOP_SHELL_OUTPUT_BYTES)"
    assert out["stdout"] == "a" * 1000 + note.format(5000)
    assert out["stderr"] == "b" * 1000 + note.format(3000)
    assert shell("echo", "short") == {"returncode": 0, "stdout": "short\n", "stderr": ""}
    started = time.monotonic()
    with pytest.raises(EffectUncertainError):  # endless output: read, counted, dropped
        shell("yes", timeout=1)
    assert time.monotonic() - started < 3


# ---- the network -----------------------------------------------------------------------------


@once
def test_the_network_is_off_unless_the_step_asks_and_the_operator_allows(
    shell: Shell, settings: Any
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        dial = ["bash", "-c", f"echo hi > /dev/tcp/127.0.0.1/{port} && echo connected"]
        assert "connected" not in shell(*dial)["stdout"]
        check = tools.get("shell.run").check_args({"argv": dial, "network": True}, "step 'w'")
        assert check == [
            "step 'w': args.network: commands get no network; "
            "set LOOP_SHELL_NETWORK=true to allow asking for it"
        ]
        with pytest.raises(tools.ToolError, match="LOOP_SHELL_NETWORK=true"):
            shell(*dial, network=True)
        settings.LOOP_SHELL_NETWORK = True
        asked = tools.get("shell.run").request_view({"argv": dial, "network": True})
        assert ("Network", "the host's network") in [(f.label, f.text) for f in asked]
        assert "connected" not in shell(*dial)["stdout"]  # allowed, but not asked for
        assert shell(*dial, network=True)["stdout"] == "connected\n"
        listener.settimeout(5)
        listener.accept()[0].close()


# ---- what can't run --------------------------------------------------------------------------


@once
def test_a_program_the_sandbox_does_not_have_is_rejected(shell: Shell) -> None:
    with pytest.raises(EffectRejected, match="can't run 'no-such-program-pippa': No such file"):
        shell("no-such-program-pippa")
    with pytest.raises(EffectRejected, match="No such file"):
        shell(str(ROOT / "manage.py"))  # the checkout is not there
    assert shell("sh", "-c", "exit 127")["returncode"] == 127  # it ran, and said 127


@once
@pytest.mark.parametrize(
    ("setting", "value", "says"),
    [
        (
            "LOOP_SHELL_BWRAP",
            "/nonexistent/bwrap",
            "no sandbox: bubblewrap's bwrap not found at LOOP_SHELL_BWRAP='/nonexistent/bwrap'"
            " (bin/install installs the bubblewrap package)",
        ),
        (
            "LOOP_SHELL_BWRAP",
            "/bin/false",
            "no sandbox: it does not start (bwrap failed before the program started: exit status 1)",
        ),
        (
            "LOOP_SHELL_USER",
            "no-such-user-pippa",
            "no sandbox: no user 'no-such-user-pippa' to run commands as"
            " (LOOP_SHELL_USER; bin/install makes it)",
        ),
        ("LOOP_SHELL_USER", "root", "no sandbox: LOOP_SHELL_USER 'root' is root"),
        (
            "LOOP_FILE_ROOT",
            str(ROOT),
            f"no sandbox: LOOP_FILE_ROOT '{ROOT}' would show commands '{ROOT}'",
        ),
    ],
)
def test_without_a_sandbox_the_tool_is_off_and_says_why(
    settings: Any, file_root: Path, setting: str, value: str, says: str
) -> None:
    assert os.geteuid() == 0  # as here and in CI: LOOP_SHELL_USER counts for a root worker
    settings.LOOP_SHELL_ENABLED = True
    setattr(settings, setting, value)
    reason = tools.get("shell.run").disabled()
    assert reason is not None and reason.startswith(says)
    plan = {"title": "T", "steps": [step("sh", "shell.run", args={"argv": ["true"]})]}
    with pytest.raises(plans.PlanError, match="tool 'shell.run' is off: no sandbox"):
        plans.validate(plan)
    with pytest.raises(tools.ToolError, match="no sandbox"):
        tools.get("shell.run").run({"argv": ["touch", "ran"]}, EFFECT_ID)
    assert not (file_root / "ran").exists()


# ---- a worker that is not root ---------------------------------------------------------------

NOT_ROOT = """
import importlib.util, json, sys
from pathlib import Path
spec = importlib.util.spec_from_file_location("sandbox", sys.argv[1])
sandbox = importlib.util.module_from_spec(spec)
sys.modules["sandbox"] = sandbox
spec.loader.exec_module(sandbox)
room = sandbox.Room("bwrap", Path(sys.argv[2]), None, 32, 1024, 64, 100_000)
said = {"unavailable": sandbox.unavailable(room)}
def run(*argv, timeout=10):
    try:
        ran = sandbox.run(room, sandbox.Command(argv, timeout=timeout))
    except sandbox.TimedOut as exc:
        return {"timed_out": str(exc)}
    return {"returncode": ran.returncode, "stdout": ran.stdout.kept.decode(),
            "stderr": ran.stderr.kept.decode()[-300:]}
said["look"] = run("sh", "-c", 'id -u; ls "$1" 2>&1; touch mine',
                   "sh", sys.argv[3])
said["bomb"] = run("sh", "-c", "b() { b | b & }; b; sleep 1; "
                  "while read -r l; do case $l in *processes*) echo $l;; esac; done < /proc/self/limits")
said["detached"] = run("sh", "-c", f"setsid sleep {sys.argv[4]} & sleep 30", timeout=1)
print(json.dumps(said))
"""


@once
def test_a_worker_that_is_not_root_sandboxes_its_commands_in_a_user_namespace(
    tmp_path: Path,
) -> None:
    """The sandbox module alone, in a process running as `nobody`: its own uid mapped into a
    user namespace, with the same room and the same bounds (RLIMIT_NPROC counts there)."""
    import pwd
    import tempfile

    nobody = pwd.getpwnam("nobody")
    folders = [Path(tempfile.mkdtemp(prefix="pippa-not-root-")) for _ in range(2)]
    root, private = folders
    try:
        for folder in folders:
            os.chown(folder, nobody.pw_uid, nobody.pw_gid)
        secret = private / "secret"
        secret.write_text("nobody's own secret")
        os.chown(secret, nobody.pw_uid, nobody.pw_gid)
        marker = f"{40 + random.random():.6f}"
        result = subprocess.run(
            [
                "/usr/bin/python3",
                "-I",
                "-c",
                NOT_ROOT,
                str(ROOT / "loop/tools/sandbox.py"),
                str(root),
                str(private),
                marker,
            ],
            user=nobody.pw_uid,
            group=nobody.pw_gid,
            extra_groups=[],
            cwd="/",
            env={"PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
        said = json.loads(result.stdout)
        assert said["unavailable"] is None
        look = said["look"]["stdout"].splitlines()
        assert look[0] == str(nobody.pw_uid) and "No such file" in look[1]
        assert (root / "mine").stat().st_uid == nobody.pw_uid
        assert "Cannot fork" in said["bomb"]["stderr"] and said["bomb"]["stdout"].split()[2:4] == [
            "32",
            "32",
        ]
        assert "past its timeout" in said["detached"]["timed_out"]
        assert running(f"sleep {marker}") == []
    finally:
        for folder in folders:
            subprocess.run(["rm", "-rf", str(folder)], check=True)


# ---- through a plan ----------------------------------------------------------------------------


def test_a_plan_writes_a_script_runs_it_and_reads_what_it_made(
    worker: Worker, settings: Any, file_root: Path
) -> None:
    """What file.write makes is the sandbox's to read and change; what the command makes,
    file.read reads."""
    settings.LOOP_SHELL_ENABLED = True
    task = make_task(
        step(
            "script",
            "file.write",
            args={"path": "job/run.sh", "content": "tr a-z A-Z < in.txt > out.txt; id -u\n"},
        ),
        step("input", "file.write", args={"path": "job/in.txt", "content": "numbers"}),
        step("run", "shell.run", args={"argv": ["sh", "run.sh"], "cwd": "job"}),
        step("read", "file.read", args={"path": "job/out.txt"}),
    )
    run_until_idle(worker)
    run, read = (Step.objects.get(task=task, key=key) for key in ("run", "read"))
    assert run.state == "done", run.error
    assert run.output == {"returncode": 0, "stdout": f"{sandbox_uid()}\n", "stderr": ""}
    assert read.output == {"content": "NUMBERS"}


ATTACK = 'env; for p in "$@"; do ls -d "$p" >/dev/null 2>&1 && echo "seen $p"; done; head -c 12 "$1"; true'


def test_a_real_runloop_runs_the_attack_in_the_sandbox(
    transactional_db: None, settings: Any, tmp_path: Path
) -> None:
    """A `manage.py runloop` with the database's URL and a secret key in its environment: its
    command sees neither, nor the data folder, the database file or its socket."""
    files = tmp_path / "files"
    files.mkdir()
    settings.LOOP_SHELL_ENABLED = True
    settings.LOOP_FILE_ROOT = str(files)
    data = Path(django_settings.DATA_DIR)
    targets = [data / "secret_key", data, ROOT]
    if connection.vendor == "sqlite":
        targets.append(Path(connection.settings_dict["NAME"]))
    targets.append(Path("/var/run/postgresql"))
    targets = [t for t in targets if t.exists()]
    task = make_task(
        step("attack", "shell.run", args={"argv": ["sh", "-c", ATTACK, "sh", *map(str, targets)]})
    )
    env = process_env(
        LOOP_SHELL_ENABLED="true", LOOP_FILE_ROOT=str(files), SECRET_KEY="runloop-secret-key-0123"
    )
    manage("runloop", "--once", env=env)
    attack = Step.objects.get(task=task)
    assert attack.state == "done", attack.error
    out = attack.output
    assert "seen" not in out["stdout"] and out["returncode"] == 0
    assert "DATABASE_URL" not in out["stdout"] and env["DATABASE_URL"] not in out["stdout"]
    assert "runloop-secret-key" not in out["stdout"] and "SECRET_KEY" not in out["stdout"]
    assert "No such file or directory" in out["stderr"]
