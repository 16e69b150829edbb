"""The `run_code` tool: Python run in the sandbox (orchestration.tools.sandbox), with files kept for
the conversation.

A conversation's files live in RUN_CODE_DIR/<conversation id>/ and nowhere else. A run sees them
read-only and works on a copy of them in a size-limited tmpfs; when its code ends, the sandbox packs
the working folder into one file, which is read here as untrusted input (regular files and folders
only, relative names without "..", sizes within RUN_CODE_FILES_MB) and replaces the kept files as a
whole. A run stopped at its time limit, or whose packed files do not pass, changes nothing. A run
outside a conversation starts empty and keeps nothing. `run_code_files_delete` removes a
conversation's files; the conversations layer calls it when a conversation is deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import shutil
import tarfile
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from django.conf import settings

from orchestration.tools.base import ToolContext, ToolResult, ToolSpec, result_clipped
from orchestration.tools.sandbox import (
    SandboxLimits,
    SandboxRun,
    SandboxSetup,
    SandboxUnavailable,
    packed_bytes_max,
    sandbox_run,
    sandbox_setup,
)

logger = logging.getLogger(__name__)

MAX_CODE_CHARS = 100_000
# How many of a conversation's files a run's result lists for the person.
LISTED_FILES = 50
STAGE_STALE_S = 3600

RUN_CODE_SPEC = ToolSpec(
    name="run_code",
    description=(
        "Run a Python 3 program and get what it prints (standard output and error). It runs in an"
        " isolated sandbox: no network, no access to this server, only the standard library and the"
        " system's Python packages, limited time and memory. Its working folder is kept for the rest of"
        " this conversation: files a run writes there can be read by later runs. Print the results you need."
    ),
    parameters={
        "type": "object",
        "properties": {"code": {"type": "string", "description": "The whole Python program to run."}},
        "required": ["code"],
        "additionalProperties": False,
    },
    side_effects=True,
)


class UnsafeFiles(Exception):
    """A run's packed files break a rule (a name, a kind of file, a size)."""


@dataclass(frozen=True)
class KeptFile:
    name: str
    size: int


def run_code_files_root() -> Path:
    return Path(settings.RUN_CODE_DIR)


def run_code_files_dir(*, conversation_id: int) -> Path:
    return run_code_files_root() / str(int(conversation_id))


def run_code_files_delete(*, conversation_id: int) -> None:
    """Remove a conversation's files (when the conversation is deleted); nothing if it has none."""
    folder = run_code_files_dir(conversation_id=conversation_id)
    with _conversation_lock(conversation_id=conversation_id):
        shutil.rmtree(folder, ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        (run_code_files_root() / f"{int(conversation_id)}.lock").unlink()


def run_code_files_list(*, conversation_id: int) -> list[KeptFile]:
    return _files_list(run_code_files_dir(conversation_id=conversation_id))


def run_code_available() -> bool:
    """Whether the tool is on and this machine can run the sandbox at all (bwrap, prlimit and the
    system Python); the seccomp filter is built at the first run, which fails closed without it."""
    try:
        _setup()
    except SandboxUnavailable:
        return False
    return True


class RunCodeTool:
    spec = RUN_CODE_SPEC

    async def run(self, *, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
        code = arguments.get("code")
        if not isinstance(code, str) or not code.strip():
            return ToolResult(content="`code` must be a non-empty string of Python.", failed=True)
        if len(code) > MAX_CODE_CHARS:
            return ToolResult(content=f"The code is longer than {MAX_CODE_CHARS} characters.", failed=True)
        try:
            setup = _setup()
        except SandboxUnavailable as error:
            logger.warning("run_code cannot run here: %s", error)
            return ToolResult(content="Running code is not available on this server.", failed=True)
        limits = SandboxLimits(
            timeout_s=max(0.5, min(context.timeout_s, settings.RUN_CODE_TIMEOUT_S)),
            memory_bytes=settings.RUN_CODE_MEMORY_MB * 1024 * 1024,
            files_bytes=settings.RUN_CODE_FILES_MB * 1024 * 1024,
            processes=settings.RUN_CODE_PROCESSES,
            output_bytes=max(1024, context.max_output_chars * 4),
        )
        stage = await asyncio.to_thread(_stage_make, code=code, uid=setup.uid, conversation_id=context.conversation_id)
        try:
            persist = (
                run_code_files_dir(conversation_id=context.conversation_id)
                if context.conversation_id is not None
                else stage / "empty"
            )
            await asyncio.to_thread(_persist_ready, persist)
            try:
                ran = await sandbox_run(setup=setup, limits=limits, persist=persist, stage=stage)
            except SandboxUnavailable as error:
                logger.warning("run_code cannot run here: %s", error)
                return ToolResult(content="Running code is not available on this server.", failed=True)
            note = ""
            files: list[KeptFile] = []
            if context.conversation_id is not None and not ran.timed_out:
                try:
                    files = await asyncio.to_thread(
                        _files_keep,
                        conversation_id=context.conversation_id,
                        packed=stage / "files.tar",
                        limit=limits.files_bytes,
                    )
                except UnsafeFiles as error:
                    note = f"\n[The files of this run were not kept: {error}]"
            elif ran.timed_out:
                note = f"\n[Stopped at the time limit of {limits.timeout_s:g} s; the files of this run were not kept.]"
            if not files and context.conversation_id is not None:
                files = await asyncio.to_thread(run_code_files_list, conversation_id=context.conversation_id)
        finally:
            await asyncio.to_thread(shutil.rmtree, stage, True)
        return _result(ran=ran, note=note, files=files, limit=context.max_output_chars)


RUN_CODE = RunCodeTool()


def _setup() -> SandboxSetup:
    if not settings.RUN_CODE_ENABLED:
        raise SandboxUnavailable("RUN_CODE_ENABLED is off")
    return sandbox_setup(
        bwrap=settings.RUN_CODE_BWRAP, python=Path(settings.RUN_CODE_PYTHON), sandbox_uid=settings.RUN_CODE_SANDBOX_UID
    )


def _result(*, ran: SandboxRun, note: str, files: list[KeptFile], limit: int) -> ToolResult:
    output = ran.output.decode("utf-8", errors="replace")
    if ran.output_cut:
        output += "\n[Output cut: the program printed more than can be shown.]"
    failed = ran.timed_out or ran.status != 0
    if ran.status is not None and ran.status != 0:
        note = f"\n[Exit status {ran.status}.]" + note
    content = (output or "(no output)") + note
    result = result_clipped(content=content, limit=limit, failed=failed)
    details = {"files": [{"name": kept.name, "size": kept.size} for kept in files[:LISTED_FILES]]}
    return ToolResult(
        content=result.content,
        failed=result.failed,
        truncated=result.truncated or ran.output_cut,
        details=details,
    )


def _stage_make(*, code: str, uid: int | None, conversation_id: int | None) -> Path:
    """A private folder for one run: its code, an empty file for its packed files, and (outside a
    conversation) an empty folder for it to start from. Owned by the sandbox's user when it is not
    the service's, so that the sandbox can read the one and write the other."""
    root = run_code_files_root() / ".runs"
    root.mkdir(parents=True, exist_ok=True)
    _stages_sweep(root)
    stage = Path(tempfile.mkdtemp(dir=root))
    (stage / "main.py").write_text(code, encoding="utf-8")
    (stage / "files.tar").touch()
    if conversation_id is None:
        (stage / "empty").mkdir()
    if uid is not None:
        for path in (stage, *stage.iterdir()):
            os.chown(path, uid, uid)
    return stage


def _stages_sweep(root: Path) -> None:
    """Remove what runs of a process that died mid-run left behind (no run lasts an hour)."""
    stale = time.time() - STAGE_STALE_S
    for entry in os.scandir(root):
        with contextlib.suppress(OSError):
            if entry.stat(follow_symlinks=False).st_mtime < stale:
                shutil.rmtree(entry.path, ignore_errors=True)


def _persist_ready(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)


@contextlib.contextmanager
def _conversation_lock(*, conversation_id: int):
    """Runs of one conversation in several processes replace its files one at a time."""
    root = run_code_files_root()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{int(conversation_id)}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _files_keep(*, conversation_id: int, packed: Path, limit: int) -> list[KeptFile]:
    """Unpack a run's files beside the conversation's and put them in their place."""
    folder = run_code_files_dir(conversation_id=conversation_id)
    fresh = Path(tempfile.mkdtemp(dir=run_code_files_root() / ".runs"))
    fresh.chmod(0o755)
    try:
        _unpack(packed=packed, into=fresh, limit=limit)
        with _conversation_lock(conversation_id=conversation_id):
            old = folder.with_name(f".{folder.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            if folder.exists():
                folder.rename(old)
            fresh.rename(folder)
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(fresh, ignore_errors=True)
    return _files_list(folder)


def _unpack(*, packed: Path, into: Path, limit: int) -> None:
    """Extract only regular files and folders with plain relative names, within `limit` bytes in
    all: the packed file was written by the sandboxed code and may be anything."""
    if packed.stat().st_size > packed_bytes_max(limit):
        raise UnsafeFiles("they take more room than a conversation may keep")
    try:
        with tarfile.open(packed, "r:") as archive:
            members = archive.getmembers()
            total = 0
            for member in members:
                name = PurePosixPath(member.name)
                if name.is_absolute() or ".." in name.parts or not name.parts or name.parts[0] in {".", ""}:
                    raise UnsafeFiles(f"the name {member.name!r} is not a plain relative one")
                if member.issparse() or not (member.isfile() or member.isdir()):
                    continue
                total += member.size
                if total > limit:
                    raise UnsafeFiles("they take more room than a conversation may keep")
            for member in members:
                target = into.joinpath(*PurePosixPath(member.name).parts)
                if member.isdir():
                    target.mkdir(mode=0o755, parents=True, exist_ok=True)
                elif member.isfile() and not member.issparse():
                    target.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
                    source = archive.extractfile(member)
                    assert source is not None
                    with source, open(target, "wb") as copy:
                        shutil.copyfileobj(source, copy)
                    target.chmod(0o644)
    except (tarfile.TarError, OSError, ValueError) as error:
        raise UnsafeFiles(f"they could not be read back ({error.__class__.__name__})") from error


def _files_list(folder: Path) -> list[KeptFile]:
    if not folder.is_dir():
        return []
    found = [
        KeptFile(name=path.relative_to(folder).as_posix(), size=path.stat().st_size)
        for path in folder.rglob("*")
        if path.is_file() and not path.is_symlink()
    ]
    return sorted(found, key=lambda kept: kept.name)
