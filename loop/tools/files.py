"""file.read (read-only) and file.write (a side effect, safe to repeat), both confined to
LOOP_FILE_ROOT.

The file root is also shell.run's workspace: when the worker is root, what file.write makes
there (files and folders) belongs to the sandbox's user (`sandbox.handed_to`), so commands can
read and change it."""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path
from typing import Any

from django.conf import settings

from ..outcomes import EffectNotSent, EffectRejected
from . import sandbox
from .base import Arg, ProbeResult, ToolError, fixed, tool
from .shown import Field


def confined(path: str) -> Path:
    """`path` resolved under LOOP_FILE_ROOT, or ToolError if it would leave the root."""
    root = Path(settings.LOOP_FILE_ROOT).resolve()
    candidate = (root / path).resolve()
    if candidate != root and root not in candidate.parents:
        raise ToolError(f"path {path!r} is outside the file root")
    return candidate


def make_folders(folder: Path, owner: tuple[int, int] | None) -> None:
    """`folder` and its missing parents, as `mkdir -p`; each one made here is given to `owner`
    (the sandbox's user: commands write where the loop's file tools do)."""
    missing = []
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    for made in reversed(missing):
        try:
            made.mkdir()
        except FileExistsError:
            continue
        if owner is not None:
            os.chown(made, *owner, follow_symlinks=False)


def _check_path(args: dict[str, Any]) -> list[str]:
    if not fixed(args["path"]):
        return []
    try:
        target = confined(args["path"])
    except (ToolError, ValueError):
        return ["args.path: outside the file root"]
    if target == Path(settings.LOOP_FILE_ROOT).resolve():
        return ["args.path: names the file root itself, not a file"]
    return []


@tool("file.read", args={"path": Arg("string")}, check=_check_path)
def file_read(args: dict[str, Any]) -> dict[str, Any]:
    target = confined(args["path"])
    try:
        content = target.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ToolError(f"{args['path']!r} is not UTF-8 text") from None
    except FileNotFoundError:
        raise ToolError(f"no file {args['path']!r}") from None
    except IsADirectoryError:
        raise ToolError(f"{args['path']!r} is a directory") from None
    if "\x00" in content:
        raise ToolError(f"{args['path']!r} has NUL bytes: not text")
    return {"content": content}


def _digest(content: str) -> str:
    return hashlib.sha256(content.encode()).hexdigest()


def _describe_write(args: dict[str, Any]) -> tuple[str, str]:
    content = args.get("content", "")
    return str(args.get("path", "")), f"{len(content)} characters, sha256 {_digest(content)[:12]}"


def _show_write(args: dict[str, Any]) -> list[Field]:
    return [
        Field("Path", str(args.get("path", "")), "code"),
        Field("Content", str(args.get("content", ""))),
    ]


def _probe_write(args: dict[str, Any], effect_id: str) -> ProbeResult:
    target = confined(args["path"])
    want = _digest(args["content"])
    try:
        have = hashlib.sha256(target.read_bytes()).hexdigest()
    except FileNotFoundError:
        return ProbeResult(False, f"{args['path']} does not exist")
    if have == want:
        return ProbeResult(
            True, f"{args['path']} has sha256 {want}", {"path": args["path"], "sha256": want}
        )
    return ProbeResult(False, f"{args['path']} has sha256 {have}, not {want}")


@tool(
    "file.write",
    args={"path": Arg("string"), "content": Arg("string")},
    side_effect=True,
    safe_to_repeat=True,
    describe=_describe_write,
    show=_show_write,
    probe=_probe_write,
    check=_check_path,
)
def file_write(args: dict[str, Any], effect_id: str) -> dict[str, Any]:
    """Write-and-rename with fsync of the file and its folder: all of it or none of it.

    A path that can never be written (a folder, no permission) is rejected; any other failure
    leaves the old file in place and is simply tried again (the kind is safe to repeat)."""
    target = confined(args["path"])
    if target.is_dir():
        raise EffectRejected(f"{args['path']!r} is a directory")
    data = args["content"].encode()
    tmp = target.with_name(f".{target.name}.{effect_id[:16]}.tmp")
    owner = sandbox.handed_to()
    try:
        make_folders(target.parent, owner)
        tmp.unlink(missing_ok=True)  # an earlier cut's, or a link planted in its place
        # O_EXCL | O_NOFOLLOW: a new file of ours, never one a link points to.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with open(fd, "wb") as handle:
            if owner is not None:
                os.fchown(fd, *owner)
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
        folder = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
    except (PermissionError, NotADirectoryError, IsADirectoryError) as exc:
        raise EffectRejected(f"can't write {args['path']!r}: {exc.strerror}") from exc
    except OSError as exc:  # a full disk, an I/O error: the rename did not happen, or repeats
        raise EffectNotSent(f"writing {args['path']!r} failed: {exc.strerror or exc}") from exc
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
    return {"path": args["path"], "sha256": hashlib.sha256(data).hexdigest()}
