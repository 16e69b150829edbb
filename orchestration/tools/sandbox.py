"""The sandbox `run_code` runs Python in: bubblewrap, a seccomp filter and resource limits.

One run is one `bwrap` process (docs/tools-sandbox.md has the threat model):

- namespaces: a new user, mount, PID, IPC, UTS, cgroup and network namespace each (`--unshare-all`),
  so the code sees no other process and has no network interface but its own loopback; it may not
  make user namespaces of its own (`--disable-userns`);
- files: a root of its own, read-only, holding only /usr (the system's Python and its libraries,
  /usr/local hidden), a fresh /proc and a minimal read-only /dev, size-limited tmpfs mounts for
  /tmp, /dev/shm and the working folder /mnt/data, the conversation's kept files read-only at /persist, the code at
  /sandbox/main.py, and one writable file, /sandbox/files.tar, that the files of /mnt/data are packed
  into when the code ends. Not the project, not the data folder, not /etc, not /home;
- environment: emptied (`--clearenv`), then only LANG, PATH and HOME;
- a seccomp filter (`seccomp_filter`) refusing the system calls a sandboxed program has no use for
  and that widen the kernel's surface: mount, ptrace, bpf, kexec, keyrings, perf, io_uring,
  namespaces, and every socket family but AF_UNIX;
- resource limits: address space, CPU seconds, file size, open files and no core files from
  `prlimit` before bwrap starts; processes (RLIMIT_NPROC) set inside, where it counts only the
  sandbox's own processes (its user namespace's); when the service runs as root, the sandbox runs as
  an unprivileged user id (RUN_CODE_SANDBOX_UID), since the kernel does not hold root to RLIMIT_NPROC;
- time: the whole process group is killed at the wall-clock limit; bwrap's `--die-with-parent` and
  the PID namespace take every process of the sandbox with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

# Inside the sandbox: where the code's files are, and where its code and packed files travel.
WORK = "/mnt/data"
PERSIST = "/persist"
CODE = "/sandbox/main.py"
PACKED = "/sandbox/files.tar"
# The user id the code has inside its user namespace (mapped to the service's, or the sandbox's).
INNER_UID = 1000

# Runs inside the sandbox under the system Python, before the code and after it: the process limit
# (which must be set inside the user namespace to count only the sandbox's processes), the kept
# files copied in, the code run as __main__ with its traceback shown from its own first frame, and
# /mnt/data packed into the one writable file on the way out. The code could change any of this (it
# runs in the same interpreter), which gains it nothing: the packed file is read outside as
# untrusted input, and everything else here only concerns the sandbox itself.
BOOTSTRAP = r"""
import os, resource, shutil, sys, tarfile, traceback
resource.setrlimit(resource.RLIMIT_NPROC, (int(sys.argv[1]),) * 2)
shutil.copytree("/persist", "/mnt/data", symlinks=True, dirs_exist_ok=True)
os.chdir("/mnt/data")
sys.path.insert(0, "/mnt/data")
sys.argv = ["main.py"]
with open("/sandbox/main.py", encoding="utf-8") as source_file:
    source = source_file.read()
status = 0
try:
    exec(compile(source, "main.py", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
except SystemExit as stop:
    if isinstance(stop.code, int):
        status = stop.code
    elif stop.code is not None:
        print(stop.code, file=sys.stderr)
        status = 1
except BaseException:
    kind, value, trace = sys.exc_info()
    traceback.print_exception(kind, value, trace.tb_next)
    status = 1
for stream in (sys.stdout, sys.stderr):
    try:
        stream.flush()
    except Exception:
        pass
try:
    with tarfile.open("/sandbox/files.tar", "w") as packed:
        for name in sorted(os.listdir("/mnt/data")):
            packed.add(os.path.join("/mnt/data", name), arcname=name)
except BaseException as error:
    print(f"The files of this run were not kept: {error}", file=sys.stderr)
os._exit(status & 0xFF)
"""

# The filter, built by libseccomp's own Python bindings under the system Python (Debian's
# python3-seccomp) and exported as BPF for bwrap's --seccomp. Blocked calls fail with an error
# rather than kill, so the code sees an ordinary exception. clone3 says ENOSYS, which makes the C
# library fall back to clone, whose flags a filter can read (clone3 passes them in memory).
SECCOMP_BUILDER = r"""
import errno, socket, sys
import seccomp
refused = [
    "acct", "add_key", "bpf", "chroot", "delete_module", "finit_module", "fsconfig", "fsmount",
    "fsopen", "fspick", "init_module", "io_uring_enter", "io_uring_register", "io_uring_setup",
    "kexec_file_load", "kexec_load", "keyctl", "lookup_dcookie", "mount", "mount_setattr",
    "move_mount", "name_to_handle_at", "open_by_handle_at", "open_tree", "perf_event_open",
    "personality", "pivot_root", "process_vm_readv", "process_vm_writev", "ptrace", "quotactl",
    "reboot", "request_key", "setns", "swapoff", "swapon", "syslog", "umount2", "unshare",
    "userfaultfd",
]
rules = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
for name in refused:
    rules.add_rule(seccomp.ERRNO(errno.EPERM), name)
rules.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
# CLONE_NEWUSER, NEWNS, NEWPID, NEWNET, NEWUTS, NEWIPC, NEWCGROUP; and TIOCSTI below.
for flag in (0x10000000, 0x00020000, 0x20000000, 0x40000000, 0x04000000, 0x08000000, 0x02000000):
    rules.add_rule(seccomp.ERRNO(errno.EPERM), "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
rules.add_rule(seccomp.ERRNO(errno.EAFNOSUPPORT), "socket", seccomp.Arg(0, seccomp.NE, socket.AF_UNIX))
rules.add_rule(seccomp.ERRNO(errno.EPERM), "ioctl", seccomp.Arg(1, seccomp.MASKED_EQ, 0xFFFFFFFF, 0x5412))
rules.export_bpf(sys.stdout)
"""


class SandboxUnavailable(Exception):
    """This machine cannot run the sandbox (no bwrap, no system Python, no seccomp bindings)."""


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float
    memory_bytes: int
    files_bytes: int
    processes: int
    output_bytes: int


@dataclass(frozen=True)
class SandboxRun:
    output: bytes
    # The code's exit status; None when it was stopped at the time limit.
    status: int | None
    timed_out: bool
    output_cut: bool


@dataclass(frozen=True)
class SandboxSetup:
    bwrap: str
    prlimit: str
    python: Path
    # The user id the sandbox runs as when the service is root; None: the service's own.
    uid: int | None


def sandbox_setup(*, bwrap: str, python: Path, sandbox_uid: int) -> SandboxSetup:
    """What a run needs from the machine, or SandboxUnavailable saying what is missing."""
    bwrap_path = shutil.which(bwrap)
    prlimit_path = shutil.which("prlimit")
    if not bwrap_path:
        raise SandboxUnavailable(f"bubblewrap ({bwrap}) is not installed")
    if not prlimit_path:
        raise SandboxUnavailable("prlimit (util-linux) is not installed")
    if not python.is_absolute() or not python.resolve().is_relative_to("/usr") or not python.exists():
        raise SandboxUnavailable(f"the sandbox's Python must be a system one under /usr, not {python}")
    return SandboxSetup(
        bwrap=bwrap_path, prlimit=prlimit_path, python=python, uid=sandbox_uid if os.geteuid() == 0 else None
    )


@functools.cache
def seccomp_filter(python: Path) -> bytes:
    """The BPF program, built once per process (a few milliseconds, under the system Python)."""
    try:
        built = subprocess.run(
            [str(python), "-I", "-c", SECCOMP_BUILDER], capture_output=True, timeout=30, check=False, env={}
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise SandboxUnavailable(f"the seccomp filter could not be built: {error}") from error
    if built.returncode != 0 or not built.stdout:
        reason = built.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise SandboxUnavailable(f"the seccomp filter could not be built (python3-seccomp?): {reason[0]}")
    return built.stdout


def packed_bytes_max(files_bytes: int) -> int:
    """The largest the packed files may be: a tar's headers and padding can double tiny files' size."""
    return 2 * files_bytes + 1024 * 1024


def sandbox_command(
    *, setup: SandboxSetup, limits: SandboxLimits, persist: Path, code: Path, packed: Path, seccomp_fd: int
) -> list[str]:
    cpu_s = int(limits.timeout_s) + 1
    return [
        setup.prlimit,
        f"--as={limits.memory_bytes}",
        f"--cpu={cpu_s}",
        # Room for the packed files, headers and all: /mnt/data's own tmpfs holds its files to files_bytes.
        f"--fsize={packed_bytes_max(limits.files_bytes)}",
        "--nofile=256",
        "--core=0",
        "--",
        setup.bwrap,
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--uid",
        str(INNER_UID),
        "--gid",
        str(INNER_UID),
        "--hostname",
        "sandbox",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--clearenv",
        "--setenv",
        "LANG",
        "C.UTF-8",
        "--setenv",
        "PATH",
        "/usr/bin:/bin",
        "--setenv",
        "HOME",
        WORK,
        "--setenv",
        "PYTHONDONTWRITEBYTECODE",
        "1",
        "--ro-bind",
        "/usr",
        "/usr",
        "--tmpfs",
        "/usr/local",
        "--remount-ro",
        "/usr/local",
        "--symlink",
        "usr/bin",
        "/bin",
        "--symlink",
        "usr/lib",
        "/lib",
        "--symlink",
        "usr/lib64",
        "/lib64",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        # /dev is a tmpfs of bwrap's with no size: only its shared-memory folder stays writable, bounded.
        "--size",
        str(16 * 1024 * 1024),
        "--tmpfs",
        "/dev/shm",
        "--remount-ro",
        "/dev",
        "--size",
        str(16 * 1024 * 1024),
        "--tmpfs",
        "/tmp",
        "--size",
        str(limits.files_bytes),
        "--tmpfs",
        WORK,
        "--ro-bind",
        str(persist),
        PERSIST,
        "--ro-bind",
        str(code),
        CODE,
        "--bind",
        str(packed),
        PACKED,
        "--remount-ro",
        "/",
        "--chdir",
        WORK,
        "--seccomp",
        str(seccomp_fd),
        str(setup.python),
        "-I",
        "-B",
        "-c",
        BOOTSTRAP,
        str(limits.processes),
    ]


async def sandbox_run(*, setup: SandboxSetup, limits: SandboxLimits, persist: Path, stage: Path) -> SandboxRun:
    """Run `stage/main.py` in a sandbox seeing `persist`'s files; its files come back in
    `stage/files.tar`. Output (standard output and error together) past `limits.output_bytes` is
    read and dropped, so a chatty program neither blocks nor fills memory."""
    bpf = await asyncio.to_thread(seccomp_filter, setup.python)
    seccomp_fd = os.memfd_create("run-code-seccomp", 0)
    try:
        os.write(seccomp_fd, bpf)
        os.lseek(seccomp_fd, 0, os.SEEK_SET)
        command = sandbox_command(
            setup=setup,
            limits=limits,
            persist=persist,
            code=stage / "main.py",
            packed=stage / "files.tar",
            seccomp_fd=seccomp_fd,
        )
        process = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env={"PATH": "/usr/bin:/bin"},
            cwd="/",
            pass_fds=(seccomp_fd,),
            start_new_session=True,
            user=setup.uid,
            group=setup.uid,
            extra_groups=[] if setup.uid is not None else None,
        )
    finally:
        os.close(seccomp_fd)
    kept = bytearray()
    cut = False

    async def read_all() -> None:
        nonlocal cut
        assert process.stdout is not None
        while chunk := await process.stdout.read(65536):
            room = limits.output_bytes - len(kept)
            if len(chunk) > room:
                cut = True
            kept.extend(chunk[: max(room, 0)])
        await process.wait()

    timed_out = False
    try:
        await asyncio.wait_for(read_all(), timeout=limits.timeout_s)
    except TimeoutError:
        timed_out = True
    finally:
        # The whole group, on every way out (a timeout, a cancelled turn): nothing outlives its run.
        if process.returncode is None or timed_out:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
    return SandboxRun(
        output=bytes(kept), status=None if timed_out else process.returncode, timed_out=timed_out, output_cut=cut
    )
