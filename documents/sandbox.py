"""Reading one file in a process of its own, within a time limit and a memory bound.

A file's bytes are untrusted and its parsers (pypdf, python-docx over lxml) are pure Python or C
that never looks at a clock: a thread cannot be stopped half-way through `docx.Document()`, and a
deadline checked between paragraphs comes too late when building the paragraphs is what is slow.
A process can be killed. So each file is parsed in a child started with `spawn` (a fresh
interpreter: forking a web process that holds threads, sockets and an engine is not safe), which
lowers its own priority, caps its own address space with `RLIMIT_AS` at what it holds plus the
plan's bound, and sends back the passages. The parent waits in short steps, and kills the child at
the deadline, or as soon as `wanted()` says the file is no longer wanted (its owner deleted it).
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable
from typing import Any

from documents.imaging import CleanImage, ImageRefused, Reading, clean, read
from documents.parsing import Parsed, ParseLimits, TooLarge, parse

# How often the parent looks at the child, the clock, and whether the file is still wanted.
POLL_S = 0.2
WANTED_EVERY_S = 1.0


class ProcessingStopped(Exception):
    """The file was not read: the reason is for its owner (over a bound) or empty (no longer wanted)."""

    def __init__(self, reason: str = "") -> None:
        super().__init__(reason)
        self.reason = reason


def parse_bounded(
    *,
    kind: str,
    data: bytes,
    limits: ParseLimits,
    seconds: float,
    memory_bytes: int,
    wanted: Callable[[], bool] = lambda: True,
) -> Parsed:
    """`parsing.parse` in a child process: its result, or ProcessingStopped when it was over the
    time or memory, over one of `limits`, or stopped because `wanted()` turned false."""
    parsed: Parsed = _run_bounded(
        "parse", (kind, data, limits), seconds=seconds, memory_bytes=memory_bytes, wanted=wanted
    )
    return parsed


def image_clean_bounded(*, data: bytes, max_pixels: int, seconds: float, memory_bytes: int) -> CleanImage:
    """`imaging.clean` in a child process: the image without its metadata, and its thumbnail; or
    ImageRefused (not an image taken, damaged, over the pixel bound), or ProcessingStopped."""
    cleaned: CleanImage = _run_bounded("clean", (data, max_pixels), seconds=seconds, memory_bytes=memory_bytes)
    return cleaned


def image_read_bounded(
    *, data: bytes, max_pixels: int, seconds: float, memory_bytes: int
) -> tuple[CleanImage, Reading]:
    """`imaging.read` in a child process: the clean image and the text OCR read in it."""
    result: tuple[CleanImage, Reading] = _run_bounded(
        "read", (data, max_pixels), seconds=seconds, memory_bytes=memory_bytes
    )
    return result


def _run_bounded(
    operation: str,
    args: tuple[Any, ...],
    *,
    seconds: float,
    memory_bytes: int,
    wanted: Callable[[], bool] = lambda: True,
) -> Any:
    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(
        target=_child, args=(sender, operation, args, memory_bytes), name=f"documents-{operation}", daemon=True
    )
    deadline = time.monotonic() + seconds
    child.start()
    sender.close()
    try:
        next_wanted = time.monotonic() + WANTED_EVERY_S
        while not receiver.poll(POLL_S):
            now = time.monotonic()
            if not child.is_alive() and not receiver.poll():
                raise ProcessingStopped(_died_reason(child.exitcode, memory_bytes))
            if now >= deadline:
                raise ProcessingStopped(
                    f"Reading this file took longer than {seconds:g} seconds, your plan's limit for one file; "
                    "it was stopped."
                )
            if now >= next_wanted:
                if not wanted():
                    raise ProcessingStopped()
                next_wanted = now + WANTED_EVERY_S
        try:
            outcome, value = receiver.recv()
        except EOFError:
            raise ProcessingStopped(_died_reason(child.exitcode, memory_bytes)) from None
    finally:
        receiver.close()
        if child.is_alive():
            child.kill()
        child.join(5)
    if outcome == "parsed":
        return value
    if outcome == "memory":
        raise ProcessingStopped(_memory_reason(memory_bytes))
    if outcome == "too_large":
        raise ProcessingStopped(value)
    if outcome == "refused":
        raise ImageRefused(value[1], value[0])
    raise RuntimeError(f"parsing failed in the child: {value}")


def _memory_reason(memory_bytes: int) -> str:
    return (
        f"Reading this file needed more than {memory_bytes // (1024 * 1024):,} MB of memory, your plan's limit "
        "for one file; it was stopped."
    )


def _died_reason(exitcode: int | None, memory_bytes: int) -> str:
    # A child that cannot allocate past RLIMIT_AS in C code (lxml) may abort instead of raising.
    return _memory_reason(memory_bytes) if exitcode is not None and exitcode < 0 else "This file could not be read."


def _address_space() -> int | None:
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return None


# What a child can be asked to do; the arguments come from the parent, never from the file.
_OPERATIONS: dict[str, Callable[..., Any]] = {
    "parse": parse,
    "clean": lambda data, max_pixels: clean(data, max_pixels=max_pixels),
    "read": lambda data, max_pixels: read(data, max_pixels=max_pixels),
}


def _child(sender: Any, operation: str, args: tuple[Any, ...], memory_bytes: int) -> None:
    """The child: below chat in the scheduler's eyes, its address space capped, one answer sent."""
    import resource

    os.nice(10)
    held = _address_space()
    if held is not None:
        # What the interpreter, the file's bytes and the parsers' modules hold already, plus the bound.
        import docx  # noqa: F401 - loaded before the cap, so the bound is the file's alone
        import PIL.Image
        import pypdf  # noqa: F401
        import pypdfium2  # noqa: F401

        PIL.Image.init()  # every format's plugin, so none is imported under the cap

        held = _address_space() or held
        cap = held + memory_bytes
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    try:
        answer: tuple[str, Any] = ("parsed", _OPERATIONS[operation](*args))
    except ImageRefused as exc:
        answer = ("refused", (exc.code, str(exc)))
    except TooLarge as exc:
        answer = ("too_large", str(exc))
    except MemoryError:
        answer = ("memory", None)
    except Exception as exc:
        answer = ("error", f"{type(exc).__name__}: {exc}"[:500])
    try:
        sender.send(answer)
    except MemoryError:
        sender.send(("memory", None))
    sender.close()
