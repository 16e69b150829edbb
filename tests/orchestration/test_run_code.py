"""The `run_code` tool: ordinary programs work and keep their files for the conversation, and each
wall of the sandbox holds against code that tries to get through it (docs/tools-sandbox.md).

Every test runs the real sandbox (bubblewrap, the seccomp filter, the limits): `make test` installs
bubblewrap and python3-seccomp; on a machine without them these tests are skipped, except in CI."""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path

import psutil
import pytest
from asgiref.sync import async_to_sync
from django.conf import settings as django_settings

from conversations.services import conversation_create, conversation_delete
from orchestration.tools import sandbox
from orchestration.tools.base import ToolContext, ToolResult
from orchestration.tools.run_code import (
    RUN_CODE,
    run_code_available,
    run_code_files_delete,
    run_code_files_dir,
    run_code_files_list,
)

pytestmark = pytest.mark.skipif(
    not run_code_available() and not os.environ.get("CI"),
    reason="bubblewrap is not installed (make test installs it)",
)

# What the code runs in: a marker of the sandbox's own processes, which fork keeps in their command line.
SANDBOX_MARK = "resource.setrlimit(resource.RLIMIT_NPROC"


@pytest.fixture(autouse=True)
def files_folder(settings):
    """A folder of the test's own for the conversations' files, readable by the sandbox's user."""
    folder = Path(tempfile.mkdtemp(prefix="run-code-"))
    folder.chmod(0o755)
    settings.RUN_CODE_DIR = folder
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def context(conversation_id: int | None = 1, *, timeout_s: float = 20, max_output_chars: int = 20_000) -> ToolContext:
    return ToolContext(
        user_id=1, conversation_id=conversation_id, timeout_s=timeout_s, max_output_chars=max_output_chars
    )


async def run(code: str, **kwargs) -> ToolResult:
    return await RUN_CODE.run(arguments={"code": code}, context=context(**kwargs))


def sandbox_processes() -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        if any(SANDBOX_MARK in part for part in process.info["cmdline"] or ()):
            found.append(process)
    return found


# --- what ordinary code gets ---------------------------------------------------------------------


async def test_it_runs_python_and_returns_what_it_prints():
    result = await run("import math\nprint(math.factorial(20), sum(range(10)))")
    assert not result.failed
    assert result.content == "2432902008176640000 45\n"


async def test_threads_subprocesses_and_a_process_pool_work_within_the_limits():
    code = """
import subprocess, threading
from multiprocessing import Pool
if __name__ == '__main__':
    with Pool(2) as pool:
        print(pool.map(abs, [-1, -2, -3]))
    print(subprocess.run(['echo', 'hi'], capture_output=True, text=True).stdout.strip())
    worker = threading.Thread(target=print, args=('thread',))
    worker.start()
    worker.join()
"""
    result = await run(code)
    assert not result.failed, result.content
    assert result.content == "[1, 2, 3]\nhi\nthread\n"


async def test_an_exception_is_a_failed_result_with_its_traceback():
    result = await run("def f():\n    return 1 / 0\nf()")
    assert result.failed
    assert 'File "main.py", line 2, in f' in result.content
    assert "ZeroDivisionError" in result.content
    assert "bootstrap" not in result.content.lower()


async def test_a_file_written_in_one_run_is_read_in_the_next_of_the_same_conversation():
    first = await run(
        "with open('notes.txt', 'w') as f:\n    f.write('remember 42')\nprint('saved')", conversation_id=7
    )
    assert first.content == "saved\n"
    assert first.details["files"] == [{"name": "notes.txt", "size": 11}]
    second = await run("print(open('notes.txt').read())", conversation_id=7)
    assert second.content == "remember 42\n"


async def test_another_conversation_does_not_see_them():
    await run("open('secret.txt', 'w').write('alice only')", conversation_id=7)
    result = await run("import os\nprint(sorted(os.listdir('.')), os.listdir('/'))", conversation_id=8)
    assert result.content.startswith("[]")
    assert "secret" not in result.content


async def test_a_run_outside_a_conversation_keeps_nothing(files_folder):
    result = await run("open('x.txt', 'w').write('x')\nprint('ok')", conversation_id=None)
    assert result.content == "ok\n"
    assert [path.name for path in files_folder.iterdir() if not path.name.startswith(".")] == []


async def test_deleting_the_conversations_files_removes_them():
    await run("open('a.txt', 'w').write('a')", conversation_id=9)
    assert run_code_files_list(conversation_id=9)
    run_code_files_delete(conversation_id=9)
    assert not run_code_files_dir(conversation_id=9).exists()
    run_code_files_delete(conversation_id=9)  # nothing left to remove is no error


@pytest.mark.topology
def test_deleting_a_conversation_deletes_its_files(alice, django_capture_on_commit_callbacks):
    conversation = conversation_create(user=alice)
    folder = run_code_files_dir(conversation_id=conversation.id)
    async_to_sync(run)("open('a.txt', 'w').write('a')", conversation_id=conversation.id)
    assert folder.exists()
    with django_capture_on_commit_callbacks(execute=True):
        conversation_delete(conversation=conversation)
        # Only once the deletion is committed: a rolled-back one keeps them.
        assert folder.exists()
    assert not folder.exists()


async def test_what_a_dead_process_left_of_its_runs_is_swept_away(files_folder):
    stale = files_folder / ".runs" / "tmpdead"
    stale.mkdir(parents=True)
    (stale / "main.py").write_text("print(1)")
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    await run("print(1)")
    assert not stale.exists()
    assert list((files_folder / ".runs").iterdir()) == []


# --- the server's files and environment ------------------------------------------------------------


async def test_it_cannot_read_the_servers_files_or_environment(monkeypatch):
    monkeypatch.setenv("DJANGO_SECRET_KEY", "the-service-secret-key")
    monkeypatch.setenv("DATABASE_URL", "postgres://user:password@db/chatsite")
    targets = [
        "/etc/passwd",
        "/etc/shadow",
        "/etc/hostname",
        str(Path(django_settings.BASE_DIR) / "chatsite" / "settings.py"),
        str(Path(django_settings.DATA_DIR) / "secret_key"),
        str(Path(django_settings.BASE_DIR) / ".env"),
        f"/proc/{os.getpid()}/environ",
        "/root/.bashrc",
        "/home",
        str(Path(django_settings.RUN_CODE_DIR)),
    ]
    code = f"""
import json, os
seen = {{}}
for path in {targets!r}:
    try:
        with open(path, 'rb') as f:
            seen[path] = f.read(200).decode('latin-1')
    except OSError as error:
        seen[path] = type(error).__name__
print(json.dumps({{'files': seen, 'env': dict(os.environ), 'root': sorted(os.listdir('/')),
                  'pid1': open('/proc/1/cmdline', 'rb').read().decode('latin-1'),
                  'pid1_env': open('/proc/1/environ', 'rb').read().decode('latin-1')}}))
"""
    result = await run(code)
    assert not result.failed, result.content
    found = json.loads(result.content)
    assert set(found["files"].values()) <= {"FileNotFoundError", "PermissionError"}, found["files"]
    assert found["env"] == {
        "LANG": "C.UTF-8",
        "PATH": "/usr/bin:/bin",
        "HOME": "/mnt/data",
        "PWD": "/mnt/data",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    assert found["root"] == sorted(["bin", "dev", "lib", "lib64", "persist", "proc", "sandbox", "tmp", "usr", "mnt"])
    # Its own PID namespace: process 1 is the sandbox's, not the machine's.
    assert "bwrap" in found["pid1"] or "python" in found["pid1"]
    assert found["pid1_env"] == "PATH=/usr/bin:/bin\x00"
    assert "the-service-secret-key" not in result.content


async def test_it_cannot_write_outside_its_working_folder():
    code = """
paths = ['/usr/lib/x', '/usr/local/x', '/etc-x', '/x', '/dev/x', '/persist/x', '/sandbox/main.py',
         '/proc/sys/kernel/hostname']
for path in paths:
    try:
        open(path, 'w').write('x')
        print('wrote', path)
    except OSError as error:
        print('refused', path, type(error).__name__)
"""
    result = await run(code)
    assert "wrote" not in result.content, result.content
    assert result.content.count("refused") == 8


async def test_code_cannot_pass_files_that_escape_the_conversations_folder(files_folder):
    """The packed files are written by the code, so it can write anything there: a name that climbs
    out, a link, a device. None of it is kept, and nothing lands outside."""
    code = """
import io, os, tarfile
with tarfile.open('/sandbox/files.tar', 'w') as packed:
    for name in ['../escaped.txt', '/abs.txt']:
        data = b'pwned'
        info = tarfile.TarInfo(name); info.size = len(data)
        packed.addfile(info, io.BytesIO(data))
os._exit(0)
"""
    result = await run(code, conversation_id=11)
    assert "were not kept" in result.content
    assert not (files_folder / "escaped.txt").exists()
    assert not (files_folder.parent / "abs.txt").exists()
    links = """
import io, os, tarfile
with tarfile.open('/sandbox/files.tar', 'w') as packed:
    link = tarfile.TarInfo('passwd'); link.type = tarfile.SYMTYPE; link.linkname = '/etc/passwd'
    packed.addfile(link)
    hard = tarfile.TarInfo('hard'); hard.type = tarfile.LNKTYPE; hard.linkname = '/etc/passwd'
    packed.addfile(hard)
    device = tarfile.TarInfo('null'); device.type = tarfile.CHRTYPE
    packed.addfile(device)
os._exit(0)
"""
    await run(links, conversation_id=11)
    assert run_code_files_list(conversation_id=11) == []
    assert list(run_code_files_dir(conversation_id=11).iterdir()) == []


# --- the network -----------------------------------------------------------------------------------


async def test_it_cannot_reach_the_network():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    code = f"""
import socket
for family, address in [(socket.AF_INET, ('127.0.0.1', {port})), (socket.AF_INET, ('127.0.0.1', 6379)),
                        (socket.AF_INET, ('127.0.0.1', 5432)), (socket.AF_INET, ('1.1.1.1', 53)),
                        (socket.AF_INET6, ('::1', {port}))]:
    try:
        s = socket.socket(family, socket.SOCK_STREAM)
        s.settimeout(2)
        s.connect(address)
        print('connected', address)
    except OSError as error:
        print('refused', address[1], error.errno)
try:
    socket.getaddrinfo('example.com', 80)
    print('resolved')
except OSError as error:
    print('no name resolution')
for family in (socket.AF_NETLINK, socket.AF_PACKET):
    try:
        socket.socket(family, socket.SOCK_RAW)
        print('opened', family)
    except OSError as error:
        print('refused', family)
"""
    try:
        result = await run(code)
    finally:
        listener.close()
    assert "connected" not in result.content, result.content
    assert "resolved" not in result.content and "opened" not in result.content
    assert result.content.count("refused") == 7


# --- the kernel ------------------------------------------------------------------------------------


async def test_the_system_calls_a_sandbox_has_no_use_for_are_refused():
    code = """
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
calls = {
    'unshare(user)': lambda: libc.unshare(0x10000000),
    'unshare(net)': lambda: libc.unshare(0x40000000),
    'mount': lambda: libc.mount(b'none', b'/tmp', b'tmpfs', 0, None),
    'ptrace': lambda: libc.ptrace(16, 1, 0, 0),
    'keyctl': lambda: libc.syscall(250, 0, 0, 0, 0, 0),
    'bpf': lambda: libc.syscall(321, 0, 0, 0),
    'chroot': lambda: libc.chroot(b'/tmp'),
}
for name, call in calls.items():
    status = call()
    print(name, 'refused' if status == -1 else 'allowed', errno.errorcode.get(ctypes.get_errno()))
"""
    result = await run(code)
    assert "allowed" not in result.content, result.content
    assert result.content.count("refused") == 7


# --- the limits ------------------------------------------------------------------------------------


async def test_it_is_stopped_at_its_time_limit_and_leaves_no_process():
    started = time.monotonic()
    result = await run(
        "import subprocess, time\nsubprocess.Popen(['sleep', '291.5'])\nwhile True:\n    pass", timeout_s=2
    )
    assert time.monotonic() - started < 10
    assert result.failed
    assert "time limit of 2 s" in result.content
    assert sandbox_processes() == []
    # An odd length, so no other program's sleep on the machine is taken for the sandbox's.
    assert not [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", "291.5"]]


async def test_a_sleeping_program_is_stopped_at_its_time_limit():
    started = time.monotonic()
    result = await run("import time\nprint('before', flush=True)\ntime.sleep(300)", timeout_s=1.5)
    assert time.monotonic() - started < 8
    assert result.failed and result.content.startswith("before\n")


async def test_forking_without_end_is_held_to_the_process_limit(settings):
    code = """
import os, time
children = 0
while True:
    try:
        pid = os.fork()
    except OSError as error:
        print('refused after', children, error.strerror)
        break
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    children += 1
"""
    result = await run(code)
    assert "refused after" in result.content, result.content
    count = int(result.content.split("refused after ")[1].split()[0])
    assert count < settings.RUN_CODE_PROCESSES
    assert sandbox_processes() == []


async def test_a_fork_bomb_ends_at_the_time_limit_and_takes_every_process_with_it():
    started = time.monotonic()
    result = await run(
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass", timeout_s=2
    )
    assert time.monotonic() - started < 10
    assert result.failed
    assert sandbox_processes() == []


async def test_allocating_without_end_is_held_to_the_memory_limit():
    code = """
blocks = []
try:
    while True:
        blocks.append(bytearray(16 * 1024 * 1024))
except MemoryError:
    print('refused after', len(blocks) * 16, 'MiB')
"""
    result = await run(code)
    assert "refused after" in result.content, result.content
    assert int(result.content.split()[2]) <= django_settings.RUN_CODE_MEMORY_MB


async def test_a_huge_file_is_held_to_the_files_limit(settings):
    code = """
import os
for path in ['/mnt/data/big', '/tmp/big', '/dev/shm/big']:
    try:
        with open(path, 'wb') as f:
            for _ in range(1024):
                f.write(b'x' * 1024 * 1024)
        print('wrote', path)
    except OSError as error:
        print('refused', path, os.path.getsize(path) // (1024 * 1024), 'MiB')
        os.remove(path)
print('done')
"""
    result = await run(code, conversation_id=12)
    assert "wrote" not in result.content, result.content
    assert "done" in result.content
    for line in result.content.splitlines()[:3]:
        assert int(line.split()[2]) <= settings.RUN_CODE_FILES_MB
    assert run_code_files_list(conversation_id=12) == []


async def test_many_files_are_held_to_the_files_limit_together(settings):
    code = """
written = 0
try:
    for i in range(1000):
        with open(f'part{i}', 'wb') as f:
            f.write(b'x' * 1024 * 1024)
        written += 1
except OSError:
    print('refused after', written, 'MiB')
"""
    result = await run(code, conversation_id=13)
    assert "refused after" in result.content, result.content
    assert int(result.content.split()[2]) <= settings.RUN_CODE_FILES_MB
    kept = run_code_files_list(conversation_id=13)
    assert sum(file.size for file in kept) <= settings.RUN_CODE_FILES_MB * 1024 * 1024


async def test_output_is_bounded():
    result = await run("import sys\nfor _ in range(200):\n    sys.stdout.write('y' * 100_000)", max_output_chars=5000)
    assert result.truncated
    assert len(result.content) <= 5000


# --- refusing ------------------------------------------------------------------------------------


async def test_empty_code_is_refused_without_running():
    result = await RUN_CODE.run(arguments={"code": "  "}, context=context())
    assert result.failed and "non-empty" in result.content
    result = await RUN_CODE.run(arguments={"code": 5}, context=context())
    assert result.failed


async def test_without_bubblewrap_it_says_it_is_unavailable(settings):
    settings.RUN_CODE_BWRAP = "no-such-bwrap"
    assert not run_code_available()
    result = await run("print(1)")
    assert result.failed and "not available" in result.content


async def test_turned_off_it_is_unavailable(settings):
    settings.RUN_CODE_ENABLED = False
    assert not run_code_available()
    result = await run("print(1)")
    assert result.failed and "not available" in result.content


async def test_without_the_seccomp_filter_it_fails_closed(settings, tmp_path):
    """A system Python without libseccomp's bindings cannot build the filter: nothing runs unfiltered."""
    python = tmp_path / "python3"
    python.write_text("#!/bin/sh\nexit 1\n")
    python.chmod(0o755)
    sandbox.seccomp_filter.cache_clear()
    try:
        with pytest.raises(sandbox.SandboxUnavailable):
            sandbox.seccomp_filter(python)
    finally:
        sandbox.seccomp_filter.cache_clear()
