"""Hostile programs: each ends with the right status and a clear message, nothing leaks
to the host, and the next call in the same (tenant, language) pool still works."""

from __future__ import annotations

import asyncio
import os
import pathlib
import socket
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest

from node.fncall.nsjail import NsjailBackend
from wire.execution import StageStatus

pytestmark = [pytest.mark.nsjail, pytest.mark.asyncio(loop_scope="module")]

RunFn = Callable[..., Coroutine[Any, Any, Any]]
CheckFn = Callable[..., Coroutine[Any, Any, None]]
REPO = pathlib.Path(__file__).resolve().parents[4]


def hostname_of(stdout: str) -> str:
    return stdout.strip().splitlines()[-1]


async def test_fork_bomb_is_contained(
    run: RunFn, still_works: CheckFn, runtime: NsjailBackend
) -> None:
    code = (
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    )
    result = await run(runtime, code, run_timeout_s=1.0, max_processes=16)
    assert result.error is None, result.error
    assert result.run.status is StageStatus.TIME_LIMIT
    assert "wall-clock limit of 1s" in result.run.message
    assert result.run.wall_ms < 5000
    await still_works(runtime)


async def test_bash_fork_bomb_is_contained(
    run: RunFn, still_works: CheckFn, runtime: NsjailBackend
) -> None:
    result = await run(
        runtime, ":(){ :|:& };:\nsleep 30\n", language="bash", run_timeout_s=1.0, max_processes=16
    )
    assert result.error is None, result.error
    assert result.run.status is StageStatus.TIME_LIMIT
    await still_works(runtime, language="bash")


async def test_process_limit_is_enforced(run: RunFn, runtime: NsjailBackend) -> None:
    code = (
        "import subprocess\n"
        "procs = []\n"
        "for _ in range(40):\n"
        "    try:\n"
        "        procs.append(subprocess.Popen(['/bin/sleep', '10']))\n"
        "    except OSError as exc:\n"
        "        print('refused', exc.errno)\n"
        "        break\n"
        "print(len(procs))\n"
    )
    result = await run(runtime, code, max_processes=8)
    assert result.run.ok, result.run
    refused, started = result.run.stdout.split("\n")[:2]
    assert refused == "refused 11"  # EAGAIN
    assert int(started) < 8


async def test_memory_bomb_is_killed_at_the_jail_limit(
    run: RunFn, still_works: CheckFn, runtime: NsjailBackend
) -> None:
    code = "chunks = []\nwhile True:\n    chunks.append(b'x' * (8 << 20))\n"
    result = await run(runtime, code, memory_mb=128)
    assert result.error is None, result.error
    assert result.run.status is StageStatus.MEMORY_LIMIT, result.run
    assert "memory limit of 128 MB" in result.run.message
    assert "out-of-memory killer" in result.run.message  # the kernel's count, not a MemoryError
    await still_works(runtime)


async def test_memory_bomb_across_processes_hits_the_cgroup(
    run: RunFn, still_works: CheckFn, runtime: NsjailBackend
) -> None:
    # each child stays under the limit; together they exceed the jail's cgroup
    code = (
        "import os, time\n"
        "for _ in range(6):\n"
        "    if os.fork() == 0:\n"
        "        block = b'x' * (100 << 20)\n"
        "        time.sleep(1)\n"
        "        os._exit(0)\n"
        "for _ in range(6):\n"
        "    os.wait()\n"
    )
    result = await run(runtime, code, memory_mb=128, run_timeout_s=8.0)
    assert result.error is None, result.error
    assert result.run.status is StageStatus.MEMORY_LIMIT, result.run
    assert "out-of-memory killer" in result.run.message
    await still_works(runtime)


async def test_cpp_memory_bomb(run: RunFn, runtime: NsjailBackend) -> None:
    code = (
        "#include <cstring>\n#include <vector>\n"
        "int main() { std::vector<char*> v; for (;;) { char *p = new char[1 << 20];"
        " std::memset(p, 1, 1 << 20); v.push_back(p); } }"
    )
    result = await run(runtime, code, language="cpp", memory_mb=64)
    assert result.compile.ok, result.compile
    assert result.run.status is StageStatus.MEMORY_LIMIT, result.run
    assert "std::bad_alloc" in result.run.stderr


async def test_run_stage_gets_the_run_limits_not_the_compilers(
    run: RunFn, runtime: NsjailBackend
) -> None:
    # the compiler may use 1 GiB; the program it builds only its own 128 MB (+ overhead):
    # four processes touching 100 MB each must meet the OOM killer (a long time limit: on a
    # loaded machine reclaim can spin for seconds before the kill; the limit is not tested)
    code = (
        "#include <cstdlib>\n#include <unistd.h>\n#include <sys/wait.h>\n"
        "int main() { for (int i = 0; i < 4; i++) if (fork() == 0) {"
        " volatile char *p = (volatile char*) malloc(100 << 20);"
        " for (long j = 0; p && j < (100 << 20); j += 4096) p[j] = 1; sleep(2); _exit(0); }"
        " while (wait(nullptr) > 0) {} return 0; }"
    )
    result = await run(runtime, code, language="cpp", memory_mb=128, run_timeout_s=20.0)
    assert result.compile.ok, result.compile
    assert result.run.status is StageStatus.MEMORY_LIMIT, result.run
    assert "out-of-memory killer" in result.run.message


async def test_infinite_loop_hits_the_time_limit(
    run: RunFn, still_works: CheckFn, runtime: NsjailBackend
) -> None:
    result = await run(runtime, "while True:\n    pass\n", run_timeout_s=1.0)
    assert result.run.status is StageStatus.TIME_LIMIT
    assert result.run.signal == 9 and "wall-clock" in result.run.message
    assert 900 <= result.run.wall_ms < 4000
    assert result.run.cpu_ms is not None and result.run.cpu_ms > 0
    await still_works(runtime)


async def test_sleeping_past_the_limit(
    run: RunFn, still_works: CheckFn, runtime: NsjailBackend
) -> None:
    result = await run(
        runtime, "import time\nprint('zz', flush=True)\ntime.sleep(60)\n", run_timeout_s=1.0
    )
    assert result.run.status is StageStatus.TIME_LIMIT
    assert result.run.stdout == "zz\n"
    assert result.run.wall_ms < 4000
    await still_works(runtime)


async def test_output_flood_is_capped_and_drained(
    run: RunFn, still_works: CheckFn, runtime: NsjailBackend
) -> None:
    # 64 MiB on each stream, then a normal exit: the capture keeps 4 KiB of each
    code = (
        "import sys\n"
        "chunk = 'x' * 65536\n"
        "for _ in range(1024):\n"
        "    sys.stdout.write(chunk)\n"
        "    sys.stderr.write(chunk)\n"
        "print('done', file=sys.stderr)\n"
    )
    result = await run(runtime, code, max_output_bytes=4096, run_timeout_s=20.0)
    assert result.run.status is StageStatus.FINISHED and result.run.exit_code == 0
    assert result.run.stdout == "x" * 4096 and result.run.stdout_truncated
    assert len(result.run.stderr) == 4096 and result.run.stderr_truncated
    assert "truncated" in result.run.message
    # an endless flood ends at the time limit, still capped
    result = await run(
        runtime, "while True:\n    print('y' * 1000)\n", max_output_bytes=2048, run_timeout_s=1.0
    )
    assert result.run.status is StageStatus.TIME_LIMIT
    assert len(result.run.stdout) == 2048 and result.run.stdout_truncated
    await still_works(runtime)


async def test_huge_file_in_the_work_dir(
    run: RunFn, still_works: CheckFn, runtime: NsjailBackend
) -> None:
    code = "with open('big', 'wb') as f:\n    while True:\n        f.write(b'x' * (1 << 20))\n"
    result = await run(runtime, code, max_file_bytes=4 << 20)
    assert result.run.status is StageStatus.OUTPUT_LIMIT, result.run
    assert result.run.signal == 25  # SIGXFSZ
    assert "file size limit" in result.run.message
    # with a generous RLIMIT_FSIZE the tmpfs size is the wall: ENOSPC, not a full host disk
    code = (
        "import errno\n"
        "try:\n"
        "    with open('/tmp/big', 'wb') as f:\n"
        "        while True:\n"
        "            f.write(b'x' * (1 << 20))\n"
        "except OSError as exc:\n"
        "    print(errno.errorcode[exc.errno])\n"
    )
    result = await run(runtime, code, max_file_bytes=1 << 30, memory_mb=512)
    assert result.run.ok, result.run
    assert result.run.stdout == "ENOSPC\n"
    await still_works(runtime)


async def test_writes_outside_the_work_dir_fail(
    run: RunFn, still_works: CheckFn, runtime: NsjailBackend
) -> None:
    targets = [
        "/usr/bin/corral-evil",
        "/usr/lib/corral-evil",
        "/etc/passwd",
        "/etc/corral-evil",
        "/corral-evil",
        "/bin/corral-evil",
        "/proc/sys/kernel/hostname",
        "/dev/corral-evil",
    ]
    code = (
        "import errno\n"
        f"for path in {targets!r}:\n"
        "    try:\n"
        "        with open(path, 'w') as f:\n"
        "            f.write('pwned')\n"
        "        print(path, 'WRITTEN')\n"
        "    except OSError as exc:\n"
        "        print(path, errno.errorcode[exc.errno])\n"
    )
    result = await run(runtime, code)
    assert result.run.ok, result.run
    assert "WRITTEN" not in result.run.stdout, result.run.stdout
    assert len(result.run.stdout.splitlines()) == len(targets)
    assert host_untouched(targets)
    await still_works(runtime)


@pytest.fixture
def listener() -> Iterator[tuple[int, list[Any]]]:
    """A real TCP listener on the host's 127.0.0.1, recording any connection."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    accepted: list[Any] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, addr = server.accept()
            except OSError:
                continue
            accepted.append(addr)
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1], accepted
    finally:
        stop.set()
        thread.join()
        server.close()


async def test_host_loopback_is_unreachable(
    run: RunFn, still_works: CheckFn, runtime: NsjailBackend, listener: tuple[int, list[Any]]
) -> None:
    port, accepted = listener
    # sanity: the listener works from the host
    with socket.create_connection(("127.0.0.1", port), timeout=2):
        pass
    for _ in range(50):
        if accepted:
            break
        threading.Event().wait(0.02)
    assert len(accepted) == 1
    code = (
        "import errno, socket\n"
        f"for host in ('127.0.0.1', 'localhost', '10.0.2.2', '1.1.1.1'):\n"
        "    try:\n"
        f"        socket.create_connection((host, {port}), timeout=2).close()\n"
        "        print(host, 'CONNECTED')\n"
        "    except OSError as exc:\n"
        "        print(host, errno.errorcode.get(exc.errno, exc))\n"
        # the interfaces of the jail's network namespace (if_nameindex() would need
        # AF_NETLINK, which the seccomp policy refuses)
        "print(sorted(line.split(':')[0].strip() for line in open('/proc/net/dev')"
        ".read().splitlines()[2:]))\n"
    )
    result = await run(runtime, code)
    assert result.run.ok, result.run
    lines = result.run.stdout.splitlines()
    assert lines[0] == "127.0.0.1 ECONNREFUSED"  # the jail's own loopback, nobody listens
    assert "CONNECTED" not in result.run.stdout
    assert lines[2].endswith("ENETUNREACH") and lines[3].endswith("ENETUNREACH")
    assert lines[4] == "['lo']"
    assert len(accepted) == 1  # only the host's own sanity connection
    await still_works(runtime)


async def test_host_secrets_are_not_visible(
    run: RunFn,
    still_works: CheckFn,
    runtime: NsjailBackend,
    tmp_path: pathlib.Path,
) -> None:
    data_dir = tmp_path / "var"
    data_dir.mkdir()
    (data_dir / "corral.db").write_text("TOP-SECRET-DATA")
    data_dir.chmod(0o755)
    (data_dir / "corral.db").chmod(0o644)
    paths = [
        "/etc/shadow",
        "/etc/gshadow",
        "/root",
        "/root/.bashrc",
        "/home",
        str(REPO / "app" / "settings.py"),
        str(REPO / "pyproject.toml"),
        str(data_dir / "corral.db"),
        str(data_dir),
        "/proc/1/environ",
        "/proc/1/mem",
        "/proc/1/fd/1",
        "/sys/fs/cgroup",
    ]
    code = (
        "import errno, os\n"
        f"for path in {paths!r}:\n"
        "    try:\n"
        "        if os.path.isdir(path):\n"
        "            print(path, 'LISTED', os.listdir(path))\n"
        "        else:\n"
        "            print(path, 'READ', open(path, 'rb').read(64))\n"
        "    except OSError as exc:\n"
        "        print(path, errno.errorcode[exc.errno])\n"
        "print(sorted(os.listdir('/')))\n"
        "print(sorted(os.listdir('/etc')))\n"
    )
    result = await run(runtime, code)
    assert result.run.ok, result.run
    out = result.run.stdout
    assert "READ" not in out and "LISTED" not in out, out
    assert "TOP-SECRET" not in out
    lines = out.splitlines()
    assert lines[-2] == str(
        sorted(["bin", "box", "dev", "etc", "lib", "lib64", "proc", "tmp", "usr"])
    )
    assert "shadow" not in lines[-1] and "passwd" in lines[-1]
    await still_works(runtime)


async def test_killing_the_parent_does_not_break_the_jail(
    run: RunFn, still_works: CheckFn, runtime: NsjailBackend
) -> None:
    probe = "import socket\nprint(socket.gethostname())\n"
    before = await run(runtime, probe)
    code = (
        "import os, signal, socket\n"
        "print('parent', os.getppid())\n"
        "for sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGSTOP, signal.SIGINT):\n"
        "    os.kill(os.getppid(), sig)\n"
        "print('alive')\n"
        "print(socket.gethostname())\n"
    )
    result = await run(runtime, code)
    assert result.run.status is StageStatus.FINISHED and result.run.exit_code == 0, result.run
    assert result.run.stdout.startswith("parent 1\nalive\n")
    after = await run(runtime, probe)
    assert after.run.ok
    # the very same jail (its zygote survived) served all three calls
    assert hostname_of(before.run.stdout) == hostname_of(result.run.stdout)
    assert hostname_of(after.run.stdout) == hostname_of(before.run.stdout)
    bash = await run(runtime, "kill -9 -1\nkill -9 1\necho survived\nhostname\n", language="bash")
    assert bash.run.status is StageStatus.FINISHED, bash.run
    assert bash.run.stdout.startswith("survived\n")
    await still_works(runtime, language="bash")


#: the blocked, ignored and caught signals of a process, from its /proc/self/status
SIGNAL_MASKS = ("SigBlk", "SigIgn", "SigCgt")
#: signals 32 and 33 are glibc's own (thread cancellation, set*id in threads): sigaction
#: refuses them, glibc installs its handlers before it uses them, and a jail's process
#: inherits them as the processes that started the jail had them (in a CI run, 32
#: arrived ignored)
GLIBC_SIGNALS = (1 << (32 - 1)) | (1 << (33 - 1))


def signal_masks(stdout: str) -> dict[str, int]:
    """The masks of the signals the zygote sets (all but glibc's own)."""
    fields = dict(line.split(":", 1) for line in stdout.splitlines() if ":" in line)
    return {name: int(fields[name].strip(), 16) & ~GLIBC_SIGNALS for name in SIGNAL_MASKS}


async def test_the_code_gets_default_signals_not_the_templates(
    run: RunFn, runtime: NsjailBackend
) -> None:
    """The template ignores every signal it can (the code may signal it); the call's
    process sets them back before the code runs: Python's own dispositions for Python
    code (SIGPIPE ignored, SIGINT caught as KeyboardInterrupt), none for a program."""
    probe = "print(open('/proc/self/status').read())"
    for _ in range(2):  # the first spare and one forked after a call
        python = await run(runtime, probe)
        assert python.run.ok, python.run
        assert signal_masks(python.run.stdout) == {
            "SigBlk": 0,
            "SigIgn": 1 << (13 - 1),  # SIGPIPE
            "SigCgt": 1 << (2 - 1),  # SIGINT
        }
    bash = await run(runtime, "exec cat /proc/self/status\n", language="bash")
    assert bash.run.ok, bash.run
    assert signal_masks(bash.run.stdout) == {"SigBlk": 0, "SigIgn": 0, "SigCgt": 0}


async def test_seccomp_and_privileges(run: RunFn, runtime: NsjailBackend) -> None:
    code = (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "def call(name, *args):\n"
        "    rc = getattr(libc, name)(*args)\n"
        "    print(name, rc, os.strerror(ctypes.get_errno()) if rc == -1 else '')\n"
        "call('ptrace', 0, 0, 0, 0)\n"  # PTRACE_TRACEME
        "call('unshare', 0x10000000)\n"  # CLONE_NEWUSER
        "call('mount', b'none', b'/tmp', b'tmpfs', 0, None)\n"
        "call('syscall', 321, 0, 0, 0)\n"  # bpf
        "call('syscall', 425, 8, 0)\n"  # io_uring_setup
        "call('syscall', 323, 0)\n"  # userfaultfd
        "status = dict(l.split(':\\t', 1) for l in open('/proc/self/status').read().splitlines())\n"
        "print(status['Seccomp'].strip(), status['CapEff'].strip(), status['NoNewPrivs'].strip())\n"
        "print(open('/proc/self/uid_map').read().split())\n"
    )
    result = await run(runtime, code)
    assert result.run.ok, result.run
    lines = result.run.stdout.splitlines()
    for line in lines[:6]:
        assert line.split()[1] == "-1" and "Operation not permitted" in line, line
    assert lines[6] == "2 0000000000000000 1"
    assert lines[7] == ["65534", "65534", "1"].__repr__()


async def test_background_process_is_killed_and_jail_recycled(
    run: RunFn, still_works: CheckFn, runtime: NsjailBackend
) -> None:
    code = (
        "import subprocess, socket\n"
        "subprocess.Popen(['/bin/sleep', '1000'], start_new_session=True)\n"
        "print(socket.gethostname())\n"
    )
    result = await run(runtime, code, tenant="tenant-bg")
    assert result.run.ok, result.run
    nobody_sleepers = [
        pid
        for pid in os.listdir("/proc")
        if pid.isdigit() and _cmdline(pid) == b"/bin/sleep\x001000\x00" and _uid(pid) == 65534
    ]
    assert nobody_sleepers == []
    nxt = await run(runtime, "import socket\nprint(socket.gethostname())\n", tenant="tenant-bg")
    assert nxt.run.ok
    assert hostname_of(nxt.run.stdout) != hostname_of(result.run.stdout)


async def test_zygote_killed_from_the_host_is_a_platform_error(
    run: RunFn, still_works: CheckFn, runtime: NsjailBackend
) -> None:
    assert runtime.pool is not None
    task = asyncio.create_task(run(runtime, "import time\ntime.sleep(5)\n", tenant="tenant-z"))
    for _ in range(200):
        await asyncio.sleep(0.01)
        busy = [j for j in runtime.pool.workers() if j.tenant == "tenant-z" and j.uses]
        if busy:
            break
    assert busy and busy[0].zygote_pid
    os.kill(busy[0].zygote_pid, 9)
    result = await task
    assert result.error is not None and "died" in result.error
    await still_works(runtime, tenant="tenant-z")


def host_untouched(targets: list[str]) -> bool:
    created = [path for path in targets if "corral-evil" in path and os.path.exists(path)]
    return not created and "pwned" not in pathlib.Path("/etc/passwd").read_text()


def _cmdline(pid: str) -> bytes:
    try:
        return pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _uid(pid: str) -> int:
    try:
        return pathlib.Path(f"/proc/{pid}").stat().st_uid
    except OSError:
        return -1


async def test_nothing_persists_between_calls_of_one_tenant(
    run: RunFn, runtime: NsjailBackend
) -> None:
    leave = (
        "import ctypes, os, socket\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "shm = libc.shmget(0x1234, 4096, 0o1000 | 0o600)\n"  # IPC_CREAT
        "msg = libc.msgget(0x1235, 0o1000 | 0o600)\n"
        "sem = libc.semget(0x1236, 1, 0o1000 | 0o600)\n"
        "mq = libc.mq_open(b'/corral', os.O_CREAT | os.O_RDWR, 0o600, None)\n"
        "print(shm >= 0, msg >= 0, sem >= 0, mq, os.strerror(ctypes.get_errno()))\n"
        "for path in ('/tmp/left', '/dev/shm/left', '/box/left', 'left'):\n"
        "    open(path, 'w').write('x')\n"
        "os.environ['LEFT'] = '1'\n"
        "print(socket.gethostname())\n"
    )
    first = await run(runtime, leave, tenant="tenant-persist")
    assert first.run.ok, first.run
    created, host = first.run.stdout.splitlines()
    assert created == "True True True -1 Operation not permitted"  # mq_* is denied
    look = (
        "import ctypes, os, socket\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "print(libc.shmget(0x1234, 0, 0), libc.msgget(0x1235, 0), libc.semget(0x1236, 0, 0))\n"
        "print([p for p in ('/tmp/left', '/dev/shm/left', '/box/left', 'left')"
        " if os.path.exists(p)], 'LEFT' in os.environ)\n"
        "print(socket.gethostname())\n"
    )
    second = await run(runtime, look, tenant="tenant-persist")
    assert second.run.ok, second.run
    ipc, files, host2 = second.run.stdout.splitlines()
    assert host2 == host  # the same jail served both calls
    assert ipc == "-1 -1 -1"
    assert files == "[] False"
