"""The jail's walls against hostile code: socket families, the x32 ABI and the
allow-list, a pristine template for every call, an unforgeable status channel, and what
the jail must not see of the host. Every test here runs real jails and failed before the
wall it checks was built."""

from __future__ import annotations

import itertools
import os
import secrets
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from node.fncall.nsjail import NsjailBackend
from node.fncall.nsjail.command import MASKED_PROC
from wire.execution import StageStatus

pytestmark = [pytest.mark.nsjail, pytest.mark.asyncio(loop_scope="module")]

RunFn = Callable[..., Coroutine[Any, Any, Any]]
CheckFn = Callable[..., Coroutine[Any, Any, None]]


def hostname_of(stdout: str) -> str:
    return stdout.strip().splitlines()[-1]


# --- socket families (finding 3) -----------------------------------------------------


async def test_only_unix_and_inet_socket_families(run: RunFn, runtime: NsjailBackend) -> None:
    code = (
        "import errno, socket\n"
        "families = [('AF_VSOCK', 40, socket.SOCK_STREAM), ('AF_NETLINK', 16, socket.SOCK_RAW),\n"
        "            ('AF_PACKET', 17, socket.SOCK_DGRAM), ('AF_ALG', 38, socket.SOCK_SEQPACKET),\n"
        "            ('AF_KEY', 15, socket.SOCK_RAW), ('AF_XDP', 44, socket.SOCK_RAW)]\n"
        "for name, family, kind in families:\n"
        "    for call in (socket.socket, socket.socketpair):\n"
        "        try:\n"
        "            made = call(family, kind)\n"
        "            print(name, call.__name__, 'ALLOWED')\n"
        "        except OSError as exc:\n"
        "            print(name, call.__name__, errno.errorcode.get(exc.errno, exc.errno))\n"
    )
    result = await run(runtime, code)
    assert result.run.ok, result.run
    lines = result.run.stdout.splitlines()
    assert len(lines) == 12, lines
    # the filter's answer, whatever the kernel would have said (AF_VSOCK and AF_NETLINK
    # used to be created and bound)
    assert all(line.endswith(" EAFNOSUPPORT") for line in lines), lines


async def test_unix_and_inet_sockets_still_work(run: RunFn, runtime: NsjailBackend) -> None:
    # a unix socketpair, and TCP over the jail's own loopback (v4 and v6)
    code = (
        "import socket, threading\n"
        "a, b = socket.socketpair()\n"
        "a.sendall(b'unix'); print(b.recv(4).decode())\n"
        "for family, host in ((socket.AF_INET, '127.0.0.1'), (socket.AF_INET6, '::1')):\n"
        "    server = socket.socket(family, socket.SOCK_STREAM)\n"
        "    server.bind((host, 0)); server.listen(1)\n"
        "    port = server.getsockname()[1]\n"
        "    def serve():\n"
        "        conn, _ = server.accept(); conn.sendall(conn.recv(16).upper()); conn.close()\n"
        "    thread = threading.Thread(target=serve); thread.start()\n"
        "    with socket.create_connection((host, port)) as client:\n"
        "        client.sendall(b'tcp'); print(client.recv(16).decode())\n"
        "    thread.join()\n"
    )
    result = await run(runtime, code)
    assert result.run.ok, result.run
    assert result.run.stdout == "unix\nTCP\nTCP\n"


# --- x32 and the allow-list (finding 9) ----------------------------------------------


X32 = 0x40000000


async def test_x32_syscalls_are_refused_by_the_filter(run: RunFn, runtime: NsjailBackend) -> None:
    # with the x32 ABI off (this kernel) the kernel itself says ENOSYS; the filter must
    # refuse these numbers first, with its own EPERM
    code = (
        "import ctypes, errno\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "libc.syscall.restype = ctypes.c_long\n"
        f"calls = [('unshare', {X32 | 272}, (0x10000000,)),\n"
        f"         ('mount', {X32 | 165}, (b'none', b'/tmp', b'tmpfs', 0, None)),\n"
        f"         ('bpf', {X32 | 321}, (0, 0, 0)), ('getpid', {X32 | 39}, ()),\n"
        f"         ('beyond', {X32 | 0x3FFFFFFF}, ())]\n"
        "for name, nr, args in calls:\n"
        "    rc = libc.syscall(ctypes.c_long(nr), *args)\n"
        "    print(name, rc, errno.errorcode.get(ctypes.get_errno()))\n"
    )
    result = await run(runtime, code)
    assert result.run.ok, result.run
    lines = result.run.stdout.splitlines()
    assert lines == [f"{name} -1 EPERM" for name in ("unshare", "mount", "bpf", "getpid", "beyond")]


async def test_syscalls_outside_the_allow_list_are_refused(
    run: RunFn, runtime: NsjailBackend
) -> None:
    # personality() is harmless and the kernel implements it (it answers 0 when allowed),
    # but no language needs it: the allow-list refuses it, for exec'd and Python code alike
    cpp = (
        "#include <cerrno>\n#include <cstdio>\n#include <cstring>\n"
        "#include <sys/personality.h>\n#include <unistd.h>\n#include <sys/syscall.h>\n"
        "int main() {\n"
        "  int rc = personality(0xffffffff);\n"
        '  std::printf("personality %d %s\\n", rc, rc == -1 ? std::strerror(errno) : "");\n'
        "  long r = syscall(1000);  // past the end of the x86-64 table\n"
        '  std::printf("nr1000 %ld %s\\n", r, std::strerror(errno));\n'
        "}\n"
    )
    result = await run(runtime, cpp, language="cpp")
    assert result.compile.ok, result.compile
    assert result.run.ok, result.run
    assert result.run.stdout == (
        "personality -1 Operation not permitted\nnr1000 -1 Operation not permitted\n"
    )
    python = (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "rc = libc.personality(0xffffffff)\n"
        "print(rc, os.strerror(ctypes.get_errno()))\n"
    )
    result = await run(runtime, python)
    assert result.run.ok, result.run
    assert result.run.stdout == "-1 Operation not permitted\n"


async def test_code_cannot_change_pid1s_limits_or_priority(
    run: RunFn, runtime: NsjailBackend, still_works: CheckFn
) -> None:
    # same uid as PID 1: without the filter, prlimit() could starve the zygote of
    # descriptors (a platform error the code chose) and setpriority() could slow it
    code = (
        "import os, resource\n"
        "calls = [('prlimit', lambda: resource.prlimit(1, resource.RLIMIT_NOFILE, (0, 0))),\n"
        "         ('setpriority', lambda: os.setpriority(os.PRIO_PROCESS, 1, 19)),\n"
        "         ('affinity', lambda: os.sched_setaffinity(1, {0}))]\n"
        "for name, call in calls:\n"
        "    try:\n"
        "        call()\n"
        "        print(name, 'CHANGED')\n"
        "    except OSError as exc:\n"
        "        print(name, exc.errno)\n"
        "nofile = resource.RLIMIT_NOFILE\n"
        "print(resource.prlimit(0, nofile) == resource.getrlimit(nofile))  # its own: fine\n"
        "os.setpriority(os.PRIO_PROCESS, 0, 15)\n"
    )
    result = await run(runtime, code, tenant="tenant-prlimit")
    assert result.run.ok, result.run
    assert result.run.stdout == "prlimit 1\nsetpriority 1\naffinity 1\nTrue\n"
    await still_works(runtime, tenant="tenant-prlimit")


# --- a pristine template for every call (finding 5) ----------------------------------

SCAN = """
import ctypes, re, socket
probe = 'corral-' + 'probe-' + {probe!r}
found = set()
with open('/proc/self/maps') as maps:
    for line in maps:
        fields = line.split()
        lo, hi = (int(x, 16) for x in fields[0].split('-'))
        name = fields[5] if len(fields) > 5 else ''
        if not fields[1].startswith('r') or name in ('[vvar]', '[vvar_vclock]', '[vsyscall]'):
            continue
        if hi - lo > 512 << 20:
            continue
        data = ctypes.string_at(lo, hi - lo)
        for match in re.finditer(rb'corral-(?:secret|output|stdin|probe)-[0-9a-f]{{32}}', data):
            found.add(match.group(0).decode())
print(sorted(found))
print(socket.gethostname())
"""


async def test_a_call_cannot_read_earlier_calls_from_memory(
    run: RunFn, runtime: NsjailBackend
) -> None:
    secret, output, stdin, probe = (secrets.token_hex(16) for _ in range(4))
    # a few hundred copies of each, in the code, the input and the output: tens of KiB
    # that pass through the zygote's buffers and allocator
    victim = (
        "import socket, sys\n"
        + f"API_KEY = 'corral-secret-{secret}'\n" * 300
        + "data = sys.stdin.read()\n"
        + f"print(('answer: corral-output-' + '{output}') * 300, len(data))\n"
        + "print(socket.gethostname())\n"
    )
    first = await run(runtime, victim, tenant="tenant-heap", stdin=f"corral-stdin-{stdin}\n" * 300)
    assert first.run.ok, first.run
    for _ in range(2):  # the call right after, and the one after that
        scan = await run(runtime, SCAN.format(probe=probe), tenant="tenant-heap")
        assert scan.run.ok, scan.run
        found, host = scan.run.stdout.splitlines()
        assert host == hostname_of(first.run.stdout)  # the same jail served every call
        # the scan works (it finds what this call itself holds) and finds nothing older
        assert found == str([f"corral-probe-{probe}"]), found


TEMPLATE_PID = (
    "import os\n"
    "def template():\n"
    "    for name in os.listdir('/proc'):\n"
    "        if name.isdigit() and int(name) not in (1, os.getpid()):\n"
    "            if open(f'/proc/{name}/cmdline', 'rb').read().startswith(b'/usr/bin/python3'):\n"
    "                return int(name)\n"
)


async def test_a_stopped_or_killed_template_costs_only_the_jail(
    run: RunFn, runtime: NsjailBackend, still_works: CheckFn
) -> None:
    # the template runs as the code's uid, so the code can signal it: a stopped one is
    # resumed by PID 1, a killed one retires the jail (the call itself is unharmed)
    probe = "import socket\nprint(socket.gethostname())\n"
    before = await run(runtime, probe, tenant="tenant-tpl")
    stop = TEMPLATE_PID + "import signal, socket\nos.kill(template(), signal.SIGSTOP)\n" + probe
    stopped = await run(runtime, stop, tenant="tenant-tpl")
    assert stopped.error is None and stopped.run.ok, stopped.run
    after = await run(runtime, probe, tenant="tenant-tpl")
    assert after.run.ok
    assert hostname_of(after.run.stdout) == hostname_of(before.run.stdout)
    kill = TEMPLATE_PID + "import signal\nos.kill(template(), signal.SIGKILL)\n" + probe
    killed = await run(runtime, kill, tenant="tenant-tpl")
    assert killed.error is None and killed.run.ok, killed.run
    fresh = await run(runtime, probe, tenant="tenant-tpl")
    assert fresh.error is None and fresh.run.ok
    assert hostname_of(fresh.run.stdout) != hostname_of(before.run.stdout)
    await still_works(runtime, tenant="tenant-tpl")


async def test_each_call_is_one_process_forked_as_pid1s_child(
    run: RunFn, runtime: NsjailBackend
) -> None:
    # the template forks each call's process straight as PID 1's child (clone with
    # CLONE_PARENT, ``zygote.siblingfork.SiblingFork``), not through a courier that forks it and
    # exits: that was one more fork and exit of the interpreter per call. The pids of a
    # jail's calls show it: one process per call, and here one thread (which also
    # checks that glibc's thread descriptor holds the process's own id: pthread_kill
    # of the main thread from another thread finds it)
    code = (
        "import os, signal, socket, threading\n"
        "got = []\n"
        "signal.signal(signal.SIGUSR1, lambda *a: got.append(1))\n"
        "main = threading.main_thread().ident\n"
        "t = threading.Thread(target=signal.pthread_kill, args=(main, signal.SIGUSR1))\n"
        "t.start()\n"
        "t.join()\n"
        "print(os.getpid(), os.getppid(), got)\n"
        "print(socket.gethostname())\n"
    )
    seen = []
    for _ in range(4):
        result = await run(runtime, code, tenant="tenant-sibling")
        assert result.run.ok, result.run
        line, host = result.run.stdout.splitlines()
        pid, ppid, got = line.split(" ", 2)
        assert (ppid, got) == ("1", "[1]")
        seen.append((host, int(pid)))
    pairs = [(a[1], b[1]) for a, b in itertools.pairwise(seen) if a[0] == b[0]]
    assert pairs, seen  # one warm jail served the tenant's calls one after another
    assert all(b - a == 2 for a, b in pairs), seen  # the call's process and its thread


# --- the status channel (finding 12) -------------------------------------------------


async def test_user_code_holds_no_descriptor_but_its_stdio(
    run: RunFn, runtime: NsjailBackend
) -> None:
    # no status pipe, no template socket, no cgroup counter, no control channel
    code = (
        "import os\n"
        "def is_open(fd):\n"
        "    try:\n"
        "        os.fstat(fd)\n"
        "        return True\n"
        "    except OSError:\n"
        "        return False\n"
        "print([fd for fd in range(3, 1024) if is_open(fd)])\n"
    )
    for language, program in (("python", code), ("bash", "ls /proc/self/fd | sort -n | xargs")):
        result = await run(runtime, program, language=language)
        assert result.run.ok, result.run
        # bash's ls holds its own directory descriptor (3) while it lists
        assert result.run.stdout == ("[]\n" if language == "python" else "0 1 2 3\n")


async def test_user_code_cannot_forge_a_platform_error(run: RunFn, runtime: NsjailBackend) -> None:
    code = (
        "import os\n"
        "for fd in range(3, 64):\n"
        "    try:\n"
        "        os.write(fd, b'Xnsjail: internal failure (forged)')\n"
        "    except OSError:\n"
        "        pass\n"
        "raise SystemExit(0)\n"
    )
    result = await run(runtime, code)
    assert result.error is None
    assert result.run.status is StageStatus.FINISHED and result.run.exit_code == 0, result.run
    for exit_code in (126, 127):
        result = await run(runtime, f"raise SystemExit({exit_code})")
        assert result.run.status is StageStatus.FINISHED, result.run
        assert result.run.exit_code == exit_code


async def test_user_code_cannot_forge_a_memory_limit(run: RunFn, runtime: NsjailBackend) -> None:
    forge = (
        "import os\n"
        "for fd in range(3, 64):\n"
        "    try:\n"
        "        os.write(fd, b'M')\n"
        "    except OSError:\n"
        "        pass\n"
        "raise SystemExit(1)\n"
    )
    result = await run(runtime, forge)
    assert result.run.status is StageStatus.FINISHED and result.run.exit_code == 1, result.run
    # a MemoryError the code raises itself, far from its limit, is its own failure
    result = await run(runtime, "raise MemoryError('not really')", memory_mb=256)
    assert result.run.status is StageStatus.FINISHED and result.run.exit_code == 1, result.run
    assert "MemoryError" in result.run.stderr
    cpp = (
        "#include <cstdio>\n"
        'int main() { std::fputs("terminate called after throwing an instance of '
        "'std::bad_alloc'\\n  what():  std::bad_alloc\\n\", stderr); return 1; }\n"
    )
    result = await run(runtime, cpp, language="cpp")
    assert result.compile.ok, result.compile
    assert result.run.status is StageStatus.FINISHED and result.run.exit_code == 1, result.run


# --- what the jail does not see of the host (finding 14) -----------------------------


async def test_host_wide_proc_files_are_masked(run: RunFn, runtime: NsjailBackend) -> None:
    code = (
        "import os\n"
        f"for name in {MASKED_PROC!r}:\n"
        "    path = '/proc/' + name\n"
        "    try:\n"
        "        print(name, len(open(path, 'rb').read()))\n"
        "    except OSError as exc:\n"
        "        print(name, errno.errorcode[exc.errno])\n"
    )
    result = await run(runtime, "import errno\n" + code)
    assert result.run.ok, result.run
    sizes = dict(line.rsplit(" ", 1) for line in result.run.stdout.splitlines())
    assert set(sizes) == set(MASKED_PROC)
    stat = sizes.pop("stat")
    # empty, or (root-only files such as pagetypeinfo) not readable at all
    assert all(size in ("0", "EACCES", "ENOENT") for size in sizes.values()), sizes
    # /proc/stat keeps its format and the CPU count, every counter zero
    result = await run(runtime, "print(open('/proc/stat').read(), end='')")
    assert len(result.run.stdout) == int(stat)
    lines = result.run.stdout.splitlines()
    assert lines[0] == "cpu  0 0 0 0 0 0 0 0 0 0" and "btime 0" in lines
    assert len([line for line in lines if line.startswith("cpu")]) == 1 + len(
        os.sched_getaffinity(0)
    )
    assert all(set(line.split()[1:]) <= {"0", "1"} for line in lines), lines


async def test_usr_local_is_empty(run: RunFn, runtime: NsjailBackend) -> None:
    result = await run(runtime, "ls -A /usr/local | wc -l\necho $PATH\n", language="bash")
    assert result.run.ok, result.run
    count, path = result.run.stdout.split()
    assert count == "0"
    assert "/usr/local" not in path


async def test_cgroup_and_mounts_show_no_host_details(run: RunFn, runtime: NsjailBackend) -> None:
    code = (
        "import socket\n"
        "print(open('/proc/self/cgroup').read(), end='')\n"
        "print('--')\n"
        "print(open('/proc/self/mountinfo').read(), end='')\n"
        "print('--')\n"
        "print(socket.gethostname())\n"
    )
    result = await run(runtime, code, tenant="tenant-mounts")
    assert result.run.ok, result.run
    cgroup, mountinfo, host = result.run.stdout.split("--\n")
    assert runtime.pool is not None
    [jail] = [j for j in runtime.pool.workers() if j.hostname == host.strip()]
    assert jail.zygote_pid and jail.pid
    for line in cgroup.splitlines():
        # every hierarchy shows the jail's own cgroup as its root: no host path, no pid
        assert line.endswith(":/"), cgroup
    for pid in (jail.zygote_pid, jail.pid):
        assert f".{pid}" not in result.run.stdout and f"/{pid}" not in result.run.stdout
    etc_dir = runtime.shared_dir
    assert etc_dir is not None
    # nothing is bound from the host's temporary directories (the generated /etc files
    # and the masks come from a private tmpfs)
    assert str(etc_dir) not in mountinfo and "/tmp/" not in mountinfo, mountinfo


async def test_languages_cope_with_the_masked_proc(run: RunFn, runtime: NsjailBackend) -> None:
    code = (
        "import os, multiprocessing, platform, time\n"
        "print(os.cpu_count() >= 1, multiprocessing.cpu_count() >= 1)\n"
        "print(bool(platform.platform()), time.monotonic() > 0)\n"
    )
    result = await run(runtime, code)
    assert result.run.ok, result.run
    assert result.run.stdout == "True True\nTrue True\n"
