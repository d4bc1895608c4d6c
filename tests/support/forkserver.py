"""A fork server for `runloop` processes, so a chaos test can kill hundreds of them.

Starting Django costs over a second here; killing a worker 200 times would spend minutes on
imports. The server imports Django once (no database connection is opened before a fork),
then forks a fresh process per `spawn` that runs the `runloop` command exactly as
`manage.py runloop` does: its own pid, its own connections, its own heartbeat thread. The
test SIGKILLs that pid and asks the server to reap it, so the pid is truly gone before the
next worker's boot looks for dead workers.

    python -m tests.support.forkserver      # stdin: "spawn LOGFILE" -> pid; "reap PID" -> status
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def serve() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pippa_site.settings")
    import django

    django.setup()
    from django.core.management import call_command

    import loop.management.commands.runloop  # noqa: F401 - loaded before the forks

    for line in sys.stdin:
        command, _, arg = line.strip().partition(" ")
        if command == "spawn":
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    os.setsid()
                    out = os.open(arg, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                    os.dup2(out, 1)
                    os.dup2(out, 2)
                    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
                    call_command("runloop")
                    code = 0
                except BaseException:
                    traceback.print_exc()
                finally:
                    os._exit(code)
            print(pid, flush=True)
        elif command == "reap":
            _, status = os.waitpid(int(arg), 0)
            print(status, flush=True)


class ForkServer:
    """The test's side: spawn a worker, kill it, reap it."""

    def __init__(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.forkserver"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.live: set[int] = set()

    def _ask(self, line: str) -> str:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        if not answer:
            raise RuntimeError(f"fork server died (exit {self.proc.poll()})")
        return answer.strip()

    def spawn(self, log: Path) -> int:
        pid = int(self._ask(f"spawn {log}"))
        self.live.add(pid)
        return pid

    def kill(self, pid: int) -> None:
        os.kill(pid, signal.SIGKILL)
        self._ask(f"reap {pid}")
        self.live.discard(pid)

    def close(self) -> None:
        for pid in list(self.live):
            self.kill(pid)
        self.proc.kill()
        self.proc.wait(timeout=30)


if __name__ == "__main__":
    serve()
