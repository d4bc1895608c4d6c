"""The room shell.run's commands run in (DESIGN.md §19): bubblewrap, a user of its own, the file
root as its one writable place.

What flows through it: `run(room, command)` takes a program's argv, its folder under the file
root, a timeout and whether it may use the host's network. It builds bwrap's arguments from the
`Room` (the settings, read once by `Room.configured()`), starts bwrap in a process group of its
own, keeps at most `room.output_bytes` of stdout and of stderr while it runs (the rest is
counted, not kept), kills the group at the timeout, and returns `Ran`, or raises `NeverStarted`
or `TimedOut`. No database, no commit: the outbox around shell.run records what came of it.

Inside, a command sees a fresh root: /usr and the /etc entries programs need (`ETC`: the
loader's cache, alternatives, certificates, name resolution, users), read-only; the file root,
read-write, at /files (its HOME and first folder); a private /tmp (a tmpfs of `file_mb`, gone
when it ends); a new /dev and a /proc of its own pid namespace. Nothing else: not the data
folder (secret key, SQLite files, keys), not the checkout, not /root, not the host's /proc or
the database's socket. Its environment is PATH, HOME, LANG, PIPPA_EFFECT_ID (and bwrap's PWD),
nothing of the worker's. Namespaces of its own for pids, IPC, host name, cgroups, and for the
network unless the step asked for it and LOOP_SHELL_NETWORK allows it. bwrap dies with its
parent, and the pid namespace dies with its first process: killing bwrap's group leaves nothing
behind, however detached (`setsid sleep 40 &`).

Between bwrap and the program sits a small helper (`HELPER`, the system's python3 with no site):
it sets the resource limits (processes, CPU seconds, file size, address space, no core files),
drops to `room.user` when the worker is root (LOOP_SHELL_USER; the kernel holds no root to
RLIMIT_NPROC, so a fork bomb as root is unbounded), and execs the program. It writes "up" to a
pipe before the exec and the errno after a failed one (the pipe closes on exec), so whether the
program started is known, not guessed from an exit status. A worker that is not root cannot
switch users: bwrap maps its own uid into a user namespace instead (no further namespaces
inside), where the limits count the sandbox's processes alone.

`unavailable(room)` says in one line why commands can't run here (no bwrap, no such user, a
sandbox that fails to start); shell.run stays off while it says anything.

Stdlib only, and no Django at import: a test loads this file alone in a process that is not root.
"""

from __future__ import annotations

import errno
import math
import os
import pwd
import selectors
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, replace
from pathlib import Path

INSIDE = "/files"  # where the file root appears in the sandbox
PATH = "/usr/local/bin:/usr/bin:/bin"
# The interpreter the helper runs on: the system's (the worker's own may live under /root).
PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3")
# Top-level folders that are usually links into /usr (merged /usr) or else system folders.
SYSTEM = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# What programs read from /etc, and nothing more (not /etc/ssl/private, not the shadow file,
# not whatever the operator keeps there). Missing entries are skipped.
ETC = (
    "/etc/alternatives",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/ssl/certs",
    "/etc/ssl/openssl.cnf",
    "/etc/ca-certificates",
    "/etc/resolv.conf",
    "/etc/hosts",
    "/etc/host.conf",
    "/etc/nsswitch.conf",
    "/etc/gai.conf",
    "/etc/services",
    "/etc/protocols",
    "/etc/localtime",
    "/etc/timezone",
    "/etc/mime.types",
    "/etc/passwd",
    "/etc/group",
    "/etc/python3",
    "/etc/python3.11",
)
KILL_GRACE = 2.0  # seconds to read what is left in the pipes after the kill
PROBE_TIMEOUT = 10.0
PROBE_RETRY = 10.0  # a failed probe is asked again after this long
# Errors of the exec (or of the helper before it) that may pass if tried again later.
AGAIN = {errno.EAGAIN, errno.ENOMEM, errno.ETXTBSY, errno.EMFILE, errno.ENFILE}

# argv: report fd, uid, gid (-1: stay), processes, CPU seconds, file bytes, address space
# bytes, then the program and its arguments.
HELPER = """\
import os, resource, sys
report, uid, gid, nproc, cpu, fsize, vmem = map(int, sys.argv[1:8])
argv = sys.argv[8:]
for which, value in ((resource.RLIMIT_NPROC, nproc), (resource.RLIMIT_CPU, cpu),
                     (resource.RLIMIT_FSIZE, fsize), (resource.RLIMIT_AS, vmem),
                     (resource.RLIMIT_CORE, 0)):
    hard = resource.getrlimit(which)[1]
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    resource.setrlimit(which, (value, value))
if uid >= 0:
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
os.write(report, b"up\\n")
os.set_inheritable(report, False)
try:
    os.execvp(argv[0], argv)
except OSError as exc:
    os.write(report, b"%d %s" % (exc.errno or 0, (exc.strerror or str(exc)).encode()))
    os._exit(127)
"""


@dataclass(frozen=True)
class Room:
    """How commands are sandboxed, as one value (`Room.configured()` reads the settings)."""

    bwrap: str  # LOOP_SHELL_BWRAP: a path, or a name looked up on PATH
    root: Path | None  # LOOP_FILE_ROOT, resolved; None: an empty tmpfs (the probe)
    user: str | None  # the user commands run as; None: this process's own, in a user namespace
    processes: int
    memory_mb: int
    file_mb: int
    output_bytes: int
    hidden: tuple[Path, ...] = ()  # never shown, even where they lie under /usr or /etc

    @classmethod
    def configured(cls) -> Room:
        from django.conf import settings

        hidden = [Path(settings.DATA_DIR), Path(settings.BASE_DIR)]
        own = settings.DATABASES["default"]  # the loop's own; sql.execute's targets may show
        if "sqlite" in own["ENGINE"] and str(own["NAME"]) != ":memory:":
            hidden.append(Path(str(own["NAME"])))
        return cls(
            bwrap=settings.LOOP_SHELL_BWRAP,
            root=Path(settings.LOOP_FILE_ROOT).resolve(),
            user=settings.LOOP_SHELL_USER if os.geteuid() == 0 else None,
            processes=settings.LOOP_SHELL_PROCESSES,
            memory_mb=settings.LOOP_SHELL_MEMORY_MB,
            file_mb=settings.LOOP_SHELL_FILE_MB,
            output_bytes=settings.LOOP_SHELL_OUTPUT_BYTES,
            hidden=tuple(sorted({path.resolve() for path in hidden})),
        )


@dataclass(frozen=True)
class Command:
    argv: tuple[str, ...]
    cwd: str = "."  # under the file root
    timeout: float = 60.0
    network: bool = False
    effect_id: str = ""


@dataclass(frozen=True)
class Output:
    """What a stream carried: its first bytes, and how many it carried in all."""

    kept: bytes
    total: int

    @property
    def cut(self) -> bool:
        return self.total > len(self.kept)


@dataclass(frozen=True)
class Ran:
    returncode: int  # the program's exit status; 128 + N when signal N ended it
    stdout: Output
    stderr: Output


class NeverStarted(Exception):
    """The program did not start, so nothing ran. `again`: it may start if tried later (the
    sandbox could not be set up, its user was at its process limit)."""

    def __init__(self, message: str, *, again: bool) -> None:
        super().__init__(message)
        self.again = again


class TimedOut(Exception):
    """It ran past its timeout: the sandbox and everything in it were killed."""

    def __init__(self, message: str, stdout: Output, stderr: Output) -> None:
        super().__init__(message)
        self.stdout = stdout
        self.stderr = stderr


def owner(user: str | None) -> tuple[int, int] | None:
    """The uid and gid of `user`, or None (no user to switch to, or no such user)."""
    if user is None:
        return None
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        return None
    return entry.pw_uid, entry.pw_gid


def handed_to() -> tuple[int, int] | None:
    """Whom the file root's folders and files belong to, so commands can read and change what
    the loop's own file tools wrote there: LOOP_SHELL_USER when this process is root (and the
    user exists), else None (this process's own, which is also the sandbox's)."""
    return owner(Room.configured().user)


# ---- availability --------------------------------------------------------------------------

_probed: dict[Room, tuple[str | None, float]] = {}


def unavailable(room: Room) -> str | None:
    """Why commands can't run in `room` here, in one line; None when they can. A sandbox that
    fails to start `true` is no sandbox (user namespaces refused, bwrap broken): that is tried
    once per process (again after PROBE_RETRY while it fails)."""
    if shutil.which(room.bwrap) is None:
        return (
            f"no sandbox: bubblewrap's bwrap not found at LOOP_SHELL_BWRAP={room.bwrap!r} "
            "(bin/install installs the bubblewrap package)"
        )
    if _python() is None:
        return f"no sandbox: no python3 at {' or '.join(PYTHONS)} for its start-up helper"
    if room.user is not None:
        found = owner(room.user)
        if found is None:
            return (
                f"no sandbox: no user {room.user!r} to run commands as "
                "(LOOP_SHELL_USER; bin/install makes it)"
            )
        if found[0] == 0:
            return f"no sandbox: LOOP_SHELL_USER {room.user!r} is root"
    if room.root is not None:
        for hidden in room.hidden:
            if hidden == room.root or room.root in hidden.parents:
                return (
                    f"no sandbox: LOOP_FILE_ROOT {str(room.root)!r} would show commands "
                    f"{str(hidden)!r}"
                )
    probe = replace(room, root=None)
    reason, at = _probed.get(probe, (None, -math.inf))
    if probe in _probed and (reason is None or time.monotonic() - at < PROBE_RETRY):
        return reason
    reason = _probe(probe)
    _probed[probe] = (reason, time.monotonic())
    return reason


def _probe(room: Room) -> str | None:
    try:
        ran = run(room, Command(("true",), timeout=PROBE_TIMEOUT))
    except (NeverStarted, TimedOut) as exc:
        return f"no sandbox: it does not start ({exc})"
    if ran.returncode != 0:
        said = _last_line(ran.stderr.kept) or f"exit status {ran.returncode}"
        return f"no sandbox: it does not start ({said})"
    return None


def _python() -> str | None:
    return next((p for p in PYTHONS if os.access(p, os.X_OK)), None)


# ---- one command ---------------------------------------------------------------------------


def run(room: Room, command: Command) -> Ran:
    """Run `command` in `room`, at most `command.timeout` seconds (and KILL_GRACE more to
    collect what is left). The file root must exist; it is handed to `room.user` if another
    user owns it."""
    target = owner(room.user)
    if room.root is not None and target is not None:
        held = os.lstat(room.root)
        if (held.st_uid, held.st_gid) != target:
            os.chown(room.root, *target, follow_symlinks=False)
    report, report_w = os.pipe()
    try:
        try:
            proc = subprocess.Popen(
                bwrap_args(room, command, report_w),
                cwd="/",
                env={"PATH": PATH},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(report_w,),
                start_new_session=True,  # its own process group: killed whole at the timeout
            )
        except OSError as exc:
            raise NeverStarted(f"bwrap did not start: {exc.strerror or exc}", again=True) from exc
        finally:
            os.close(report_w)
        stdout, stderr, timed_out = _collect(proc, command.timeout, room.output_bytes)
        said = _read_all(report)
    finally:
        os.close(report)
    if not said.startswith(b"up\n"):  # bwrap or the helper failed before the exec
        reason = _last_line(stderr.kept) or f"exit status {proc.returncode}"
        raise NeverStarted(f"bwrap failed before the program started: {reason}", again=True)
    if failed := said[3:]:
        code, _, text = failed.partition(b" ")
        raise NeverStarted(
            f"can't run {command.argv[0]!r}: {text.decode(errors='replace')}",
            again=int(code or 0) in AGAIN,
        )
    if timed_out:
        raise TimedOut(
            f"{command.argv[0]!r} ran past its timeout of {command.timeout:g}s and was killed",
            stdout,
            stderr,
        )
    return Ran(proc.returncode, stdout, stderr)


def bwrap_args(room: Room, command: Command, report_fd: int) -> list[str]:
    """bwrap's whole command line for `command` (see the module's docstring for the room)."""
    python = _python() or PYTHONS[0]
    args = [room.bwrap, "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    if not command.network:
        args.append("--unshare-net")
    target = owner(room.user)
    if target is None:  # not root: a user namespace of this uid, and no more inside it
        args += ["--unshare-user", "--disable-userns"]
    else:  # root: the helper needs these two to drop to the user; it ends with none
        args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    args += ["--die-with-parent", "--new-session"]
    args += ["--ro-bind", "/usr", "/usr"]
    system = ["/usr"]
    for top in SYSTEM:
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
            system.append(top)
    shown = [entry for entry in ETC if os.path.lexists(entry)]
    # Their folders, made readable (bwrap would make them owner-only, and the owner is root).
    for parent in sorted({str(p) for entry in shown for p in Path(entry).parents} - {"/"}):
        args += ["--perms", "0755", "--dir", parent]
    for entry in shown:
        args += ["--ro-bind-try", entry, entry]
        system.append(entry)
    for hidden in room.hidden:  # the data folder or the checkout under /usr: covered
        covered = hidden if hidden.is_dir() else hidden.parent
        if any(covered == Path(s) or Path(s) in covered.parents for s in system):
            args += ["--tmpfs", str(covered)]
    args += ["--proc", "/proc", "--dev", "/dev"]
    private_tmp = "/tmp"  # noqa: S108 - the sandbox's own tmpfs, not the host's /tmp
    args += ["--perms", "1777", "--size", str(room.file_mb << 20), "--tmpfs", private_tmp]
    if room.root is None:
        args += ["--tmpfs", INSIDE]
    else:
        args += ["--bind", str(room.root), INSIDE]
    args += ["--remount-ro", "/"]  # the fresh root itself takes no files
    folder = os.path.normpath(os.path.join(INSIDE, command.cwd))
    args += ["--chdir", folder, "--clearenv"]
    env = {"PATH": PATH, "HOME": INSIDE, "LANG": "C.UTF-8"}
    if command.effect_id:
        env["PIPPA_EFFECT_ID"] = command.effect_id
    for name, value in env.items():
        args += ["--setenv", name, value]
    uid, gid = target or (-1, -1)
    limits = [
        room.processes,
        math.ceil(command.timeout) + 1,  # CPU seconds, per process
        room.file_mb << 20,
        room.memory_mb << 20,
    ]
    args += ["--", python, "-I", "-S", "-c", HELPER, str(report_fd), str(uid), str(gid)]
    return args + [str(n) for n in limits] + list(command.argv)


def _collect(
    proc: subprocess.Popen[bytes], timeout: float, limit: int
) -> tuple[Output, Output, bool]:
    """Read stdout and stderr until both close and the process ends, keeping `limit` bytes of
    each; at the timeout, kill the process group and read what is left for KILL_GRACE."""
    assert proc.stdout is not None and proc.stderr is not None
    kept = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    total = dict.fromkeys(kept, 0)
    deadline = time.monotonic() + timeout
    timed_out = False
    with selectors.DefaultSelector() as selector:
        for fd in kept:
            os.set_blocking(fd, False)
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                if timed_out:
                    break  # killed, yet a pipe stays open: stop reading it
                _kill(proc)
                timed_out, deadline = True, time.monotonic() + KILL_GRACE
                continue
            for key, _ in selector.select(left):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fd)
                    continue
                total[key.fd] += len(chunk)
                room = limit - len(kept[key.fd])
                if room > 0:
                    kept[key.fd] += chunk[:room]
    try:
        proc.wait(timeout=max(deadline - time.monotonic(), 0))
    except subprocess.TimeoutExpired:  # it closed its output and kept running
        _kill(proc)
        timed_out = True
        proc.wait()
    proc.stdout.close()
    proc.stderr.close()
    out, err = (Output(bytes(kept[fd]), total[fd]) for fd in kept)
    return out, err, timed_out


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL bwrap's process group; the rest of the sandbox dies with it (--die-with-parent,
    and the pid namespace with its first process)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _read_all(fd: int) -> bytes:
    os.set_blocking(fd, False)
    said = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except BlockingIOError:
            return said
        if not chunk:
            return said
        said += chunk


def _last_line(raw: bytes) -> str:
    lines = raw.decode(errors="replace").strip().splitlines()
    return lines[-1][:300] if lines else ""
