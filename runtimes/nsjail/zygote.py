"""The zygote: PID 1 of one jail, and the template it forks every call's processes from.

This file is not imported by the host. Its source is handed to the jail's own
interpreter (``/usr/bin/python3 -I -c SOURCE [--cpu-fd N]``, Debian's 3.11), so it uses
the standard library only and must stay compatible with Python 3.11. ``N`` is a read-only
descriptor of the jail cgroup's CPU counter (v1 ``cpuacct.usage``), passed by the host;
PID 1 reads it at the start and end of each stage and nobody else holds it.

Three kinds of process run this code in a jail:

* **PID 1** speaks the protocol with the host, writes each call's files, hands each stage
  to a spare, captures its output, enforces its deadlines, kills and reaps everything the
  stage left, and wipes the jail after the call. It reads every request, so its memory
  holds earlier calls' code, input and output: nothing is ever forked from it after
  start-up.
* The **template** is forked by PID 1 at start-up, before any request is read, and
  never receives a byte of one. On PID 1's request it forks a spare as PID 1's child
  (``clone(CLONE_PARENT)``, see ``SiblingFork``; where that is not available, through a
  courier process that exits at once), so PID 1 waits for it, ``getppid()`` is 1, and the
  template never learns anything of a call, not even its exit status. Every call
  therefore starts from the same pristine image: the interpreter and the pre-imported
  modules.
* A **spare** holds the child's ends of its pipes and blocks until PID 1 writes its
  stage to it; then it sets itself up (session, descriptors, rlimits) and runs the
  Python code in its already-initialised interpreter, or execs the toolchain.

Protocol, over PID 1's stdin/stdout (moved to private descriptors at start-up): every
message is a 4-byte big-endian length followed by that many bytes of UTF-8 JSON.

    zygote -> host  {"op": "ready", "python": "3.11.2", "pid": 1, "vm_bytes": N}
    host -> zygote  {"op": "run", "id": ..., "sources": {...}, "files": {...}, "stdin": "...",
                     "stages": [...], "fetch": [...], "max_output": N, "max_fetch": N}
    zygote -> host  {"op": "stage", "id": ..., "index": 1}   before each stage after the first
    host -> zygote  {"op": "go", "id": ...}                 (after moving the cgroup limits)
    zygote -> host  {"op": "result", "id": ..., "stages": [...], "files": {...}, ...}
    zygote -> host  {"op": "clean", "id": ..., "ok": true}   (jail wiped, next spare ready)

End of input makes the zygote exit. Being PID 1 of the jail's PID namespace, it cannot be
killed by the code it runs (the kernel drops signals to a namespace init that has no
handler) and it adopts every orphan. The template can be killed by the code (same uid);
PID 1 notices (after each call the template must answer it, through a fork or a ping: a
SIGKILL not yet delivered leaves the process alive, but it cannot answer) and reports the
clean-up as failed, and the host replaces the jail.

The status pipe (fd 3 of a spare) reports a failure to start a stage (``X``). It is
close-on-exec, and the Python path closes it before the code runs: user code never holds
it, so nothing it writes can turn into a platform error.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import fcntl
import json
import math
import os
import resource
import select
import signal
import socket
import stat
import struct
import sys
import time
from typing import Any, NoReturn

HEADER = struct.Struct(">I")
MAX_REQUEST = 256 * 1024 * 1024
BOX = "/box"
WORK = "/box/work"
STDIN_FILE = "/box/.stdin"
WIPED = ("/tmp", "/dev/shm", BOX)
STATUS_FD = 3
CHUNK = 65536
DRAIN_AFTER_EXIT_S = 2.0
#: how long PID 1 waits for the template to fork a spare
TEMPLATE_REPLY_S = 10.0
#: how often a stage's CPU time is checked against a CPU-time limit
CPU_TICK_S = 0.05
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
MAX_FD = 1 << 16
CHILD_ENV = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/tmp",
    "LANG": "C.UTF-8",
    "TMPDIR": "/tmp",
}
#: modules every Python call finds already imported
PREIMPORT = (
    "atexit",
    "base64",
    "bisect",
    "collections",
    "dataclasses",
    "datetime",
    "decimal",
    "fractions",
    "functools",
    "hashlib",
    "heapq",
    "io",
    "itertools",
    "json",
    "math",
    "random",
    "re",
    "statistics",
    "string",
    "threading",
    "traceback",
    "types",
    "typing",
)
PR_SET_DUMPABLE = 4
IPC_RMID = 0
_LIBC: Any = None
#: clone(2) flags of a spare: its parent is the caller's (the template's parent, PID 1),
#: and the kernel writes the child's thread id into glibc's descriptor of its thread,
#: as glibc's own fork() has it do
CLONE_PARENT = 0x00008000
CLONE_CHILD_SETTID = 0x01000000
CLONE_CHILD_CLEARTID = 0x00200000
SIGCHLD = 17
#: x86-64 only: clone's syscall number, and where glibc keeps a thread's id in its
#: thread descriptor (``struct pthread``); checked against the running thread before use
SYS_CLONE_X86_64 = 56
GLIBC_TID_OFFSET_X86_64 = 0x2D0


class InputError(Exception):
    """The request names a bad path or carries undecodable data."""


class TemplateGone(RuntimeError):
    """The template process died (the code of a stage may kill it: same uid)."""


# --- control channel ---------------------------------------------------------------------


class Channel:
    def __init__(self, rfd: int, wfd: int) -> None:
        self.rfd = rfd
        self.wfd = wfd

    def _read_exact(self, n: int) -> bytes | None:
        parts: list[bytes] = []
        while n:
            chunk = os.read(self.rfd, min(n, 1 << 20))
            if not chunk:
                if parts:
                    raise EOFError("control channel closed mid-message")
                return None
            parts.append(chunk)
            n -= len(chunk)
        return b"".join(parts)

    def recv(self) -> dict[str, Any] | None:
        header = self._read_exact(HEADER.size)
        if header is None:
            return None
        (size,) = HEADER.unpack(header)
        if size > MAX_REQUEST:
            raise ValueError(f"request of {size} bytes is too large")
        body = self._read_exact(size)
        if body is None:
            raise EOFError("control channel closed mid-message")
        message = json.loads(body)
        if not isinstance(message, dict):
            raise ValueError("request is not a JSON object")
        return message

    def send(self, message: dict[str, Any]) -> None:
        body = json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode()
        view = memoryview(HEADER.pack(len(body)) + body)
        while view:
            written = os.write(self.wfd, view)
            view = view[written:]


# --- start-up --------------------------------------------------------------------------


def _high_fd(fd: int) -> int:
    """A close-on-exec copy of ``fd`` numbered 100 or above."""
    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 100)


def _setup() -> Channel:
    channel = Channel(_high_fd(0), _high_fd(1))
    devnull = os.open("/dev/null", os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.close(devnull)
    # No handlers at all: a namespace init only receives signals it handles, so the
    # code we run cannot signal us. SIGPIPE/SIGXFSZ stay ignored for our own writes.
    _default_signals()
    # The environment every call's code gets, set once here: the template and its spares
    # inherit it (a spare that set it itself took about 50 more page faults per call)
    os.environ.clear()
    os.environ.update(CHILD_ENV)
    # Not dumpable: the code we run (same uid) cannot open /proc/1/fd/*, /proc/1/mem.
    global _LIBC
    try:
        import ctypes

        _LIBC = libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE)")
    except (OSError, AttributeError) as exc:
        sys.stderr.write(f"zygote: cannot clear dumpable: {exc}\n")
        raise SystemExit(3) from exc
    for name in PREIMPORT:
        with contextlib.suppress(ImportError):
            __import__(name)
    return channel


#: the signals ``_default_signals`` ignores, and those it sets to their default action:
#: plain numbers, listed once at start-up, so that a spare runs one system call per signal
#: and little else (a spare's every step is paid in copied pages: docs/benchmarks.md)
_IGNORED_SIGNALS = (int(signal.SIGPIPE), int(signal.SIGXFSZ))
_DEFAULT_SIGNALS = tuple(
    int(signum)
    for signum in sorted(signal.valid_signals())
    if signum not in (signal.SIGKILL, signal.SIGSTOP) and signum not in _IGNORED_SIGNALS
)


def _default_signals() -> None:
    """Every signal at its default action but SIGPIPE and SIGXFSZ, ignored."""
    set_action, default, ignore = signal.signal, signal.SIG_DFL, signal.SIG_IGN
    for signum in _DEFAULT_SIGNALS:
        # not contextlib.suppress: an object per signal; a try costs nothing until it raises
        try:  # noqa: SIM105
            set_action(signum, default)
        except (OSError, ValueError):
            pass
    for signum in _IGNORED_SIGNALS:
        set_action(signum, ignore)


def _vm_bytes() -> int:
    """This process's mapped size (``VmSize``): the first field of ``/proc/self/statm``,
    in pages, read raw (a text file object and its lines cost a spare about 50 page faults)."""
    fd = os.open("/proc/self/statm", os.O_RDONLY)
    try:
        return int(os.read(fd, 256).split(maxsplit=1)[0]) * PAGE_SIZE
    finally:
        os.close(fd)


# --- files -------------------------------------------------------------------------------


def _safe_relpath(path: str) -> str:
    if not isinstance(path, str) or not path or "\0" in path or "\\" in path:
        raise InputError(f"invalid file path {path!r}")
    if path.startswith("/"):
        raise InputError(f"file path {path!r} must be relative to the work dir")
    parts = path.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise InputError(f"file path {path!r} must not contain '', '.' or '..' components")
    return path


def _write_file(rel: str, data: bytes) -> None:
    full = os.path.join(WORK, _safe_relpath(rel))
    parent = os.path.dirname(full)
    os.makedirs(parent, exist_ok=True)
    if os.path.realpath(parent) != parent:
        raise InputError(f"file path {rel!r} leaves the work dir")
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(full, flags, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def _prepare(request: dict[str, Any]) -> None:
    os.mkdir(WORK, 0o755)
    for rel, encoded in request.get("files", {}).items():
        try:
            data = base64.b64decode(encoded, validate=True)
        except (ValueError, TypeError) as exc:
            raise InputError(f"file {rel!r} is not valid base64") from exc
        _write_file(rel, data)
    for rel, text in request.get("sources", {}).items():
        _write_file(rel, text.encode("utf-8"))
    data = request.get("stdin", "").encode("utf-8")
    fd = os.open(STDIN_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def _fetch(paths: list[str], budget: int) -> tuple[dict[str, str], list[str]]:
    files: dict[str, str] = {}
    notes: list[str] = []
    for rel in paths:
        try:
            full = os.path.join(WORK, _safe_relpath(rel))
        except InputError as exc:
            notes.append(str(exc))
            continue
        real = os.path.realpath(full)
        if not real.startswith(WORK + "/"):
            notes.append(f"fetch {rel!r}: not inside the work dir")
            continue
        try:
            fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            notes.append(f"fetch {rel!r}: {exc.strerror}")
            continue
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                notes.append(f"fetch {rel!r}: not a regular file")
                continue
            if info.st_size > budget:
                notes.append(f"fetch {rel!r}: {info.st_size} bytes exceeds the fetch budget")
                continue
            data = bytearray()
            while len(data) <= budget:
                chunk = os.read(fd, CHUNK)
                if not chunk:
                    break
                data += chunk
            if len(data) > budget:
                notes.append(f"fetch {rel!r}: grew past the fetch budget")
                continue
            budget -= len(data)
            files[rel] = base64.b64encode(data).decode("ascii")
        finally:
            os.close(fd)
    return files, notes


def _remove_sysv_ipc() -> None:
    """Delete the SysV shared memory, message queues and semaphores the code left in
    the jail's IPC namespace (they outlive the processes that made them)."""
    import ctypes

    for table in ("shm", "msg", "sem"):
        try:
            with open(f"/proc/sysvipc/{table}") as f:
                rows = f.read().splitlines()[1:]
        except FileNotFoundError:
            continue
        for row in rows:
            ident = int(row.split()[1])
            if table == "sem":
                rc = _LIBC.semctl(ident, 0, IPC_RMID)
            else:
                rc = getattr(_LIBC, f"{table}ctl")(ident, IPC_RMID, None)
            if rc != 0 and ctypes.get_errno() not in (errno.EINVAL, errno.EIDRM):
                raise OSError(ctypes.get_errno(), f"cannot remove SysV {table} {ident}")


def _wipe(root: str) -> None:
    """Remove everything under ``root`` (not root itself), whatever its permissions."""
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return
    for name in names:
        path = os.path.join(root, name)
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(info.st_mode):
            if stat.S_IMODE(info.st_mode) & 0o700 != 0o700:
                os.chmod(path, 0o700)
            _wipe(path)
            os.rmdir(path)
        else:
            os.unlink(path)


# --- the stage's process (a spare, once it has its stage) -----------------------------


def _child(stage: dict[str, Any], fds: tuple[int, int, int]) -> NoReturn:
    """Runs in a spare once it has its stage; never returns.

    ``fds`` are the write ends of the stdout, stderr and status pipes. A failure before
    the code runs is reported on the status pipe (``Xsetup:`` or ``Xexec:``), which the
    code itself never holds: it is close-on-exec, and closed before Python code runs.
    """
    module: Any = None
    try:
        os.setsid()
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 20) for fd in fds]
        for target, fd in enumerate(high, start=1):
            os.dup2(fd, target)
        os.set_inheritable(STATUS_FD, False)
        os.closerange(STATUS_FD + 1, MAX_FD)
        stdin = os.open(STDIN_FILE if stage.get("stdin") else "/dev/null", os.O_RDONLY)
        if stdin != 0:
            os.dup2(stdin, 0)
            os.close(stdin)
        os.chdir(WORK)
        python = stage.get("python") is not None
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
        if python:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        else:
            signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        cpu = _cpu_rlimit(stage)
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_FSIZE, (stage["fsize"], stage["fsize"]))
        resource.setrlimit(resource.RLIMIT_NOFILE, (stage["nofile"], stage["nofile"]))
        resource.setrlimit(resource.RLIMIT_NPROC, (stage["nproc"], stage["nproc"]))
        if stage.get("as_bytes"):
            # Python code runs in this interpreter: its own mapping comes on top
            limit = stage["as_bytes"] + (_vm_bytes() if python else 0)
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        if python:
            module = _python_main(stage)
    except BaseException as exc:  # report set-up failures as the stage's error
        _status(f"Xsetup:{type(exc).__name__}: {exc}")
        os._exit(126)
    if python:
        os.close(STATUS_FD)  # from here on the code runs: it must not hold the status pipe
        _run_python(stage, module)
    try:
        os.execve(stage["argv"][0], stage["argv"], CHILD_ENV)
    except OSError as exc:
        _status(f"Xexec:cannot execute {stage['argv'][0]}: {exc.strerror}")
    os._exit(127)


def _cpu_rlimit(stage: dict[str, Any]) -> int:
    """RLIMIT_CPU (soft; the hard limit is a second more): a second beyond the stage's
    time limit (its CPU-time limit when it has one, else its wall clock), so a single
    busy process always meets the clearer limit first and RLIMIT_CPU is a backstop."""
    limit_ms = stage.get("cpu_limit_ms")
    seconds = float(limit_ms) / 1000 if limit_ms is not None else float(stage["timeout"])
    return math.ceil(seconds) + 1


def _status(message: str) -> None:
    with contextlib.suppress(OSError):
        os.write(STATUS_FD, message.encode("utf-8", "replace")[:4000])


def _python_main(stage: dict[str, Any]) -> Any:
    """Make this interpreter the program's: a fresh ``__main__``, argv and standard
    streams (everything of the run that is ours, before the code runs; the environment,
    ``CHILD_ENV``, is the one ``_setup`` gave PID 1 before the template was forked)."""
    import builtins
    import types

    filename = stage["filename"]
    path = os.path.join(WORK, filename)
    module = types.ModuleType("__main__")
    module.__dict__.update({"__file__": path, "__builtins__": builtins, "__cached__": None})
    sys.modules["__main__"] = module
    sys.argv = [filename]
    sys.path.insert(0, WORK)
    streams = {
        "stdin": open(0, encoding="utf-8", closefd=False),  # noqa: SIM115
        "stdout": open(1, "w", encoding="utf-8", closefd=False),  # noqa: SIM115
        "stderr": open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False),  # noqa: SIM115
    }
    for name, stream in streams.items():
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
    return module


def _run_python(stage: dict[str, Any], module: Any) -> NoReturn:
    """Run the user's code as ``__main__`` and exit with its status. A MemoryError is
    printed like any exception: whether the stage ran out of memory is judged by the
    host from what the kernel measured, never from what the code says."""
    import atexit
    import traceback

    code = 0
    try:
        compiled = compile(stage["python"], module.__file__, "exec", dont_inherit=True)
        exec(compiled, module.__dict__)
    except SystemExit as exc:
        code = _exit_code(exc)
    except KeyboardInterrupt as exc:
        code = 130
        _print_exception(exc, traceback)
    except BaseException as exc:
        code = 1
        _print_exception(exc, traceback)
    try:
        threading = sys.modules.get("threading")
        if threading is not None:
            threading._shutdown()  # wait for non-daemon threads
        atexit._run_exitfuncs()
    except SystemExit as exc:
        code = _exit_code(exc)
    except BaseException as exc:
        _print_exception(exc, traceback)
        code = code or 1
    for out in (sys.stdout, sys.stderr):
        try:
            out.flush()
        except BaseException:
            code = code or 120
    os._exit(code)


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    with contextlib.suppress(BaseException):
        sys.stderr.write(f"{exc.code}\n")
    return 1


def _print_exception(exc: BaseException, traceback: Any) -> None:
    try:
        tb = exc.__traceback__
        # hide the zygote's own frame(s) above the user's code
        while tb is not None and tb.tb_frame.f_code.co_filename != sys.modules[
            "__main__"
        ].__dict__.get("__file__"):
            tb = tb.tb_next
        traceback.print_exception(type(exc), exc, tb)
    except BaseException:
        pass


# --- the template -----------------------------------------------------------------------


class Template:
    """PID 1's handle on the template process (see the module docstring)."""

    def __init__(self) -> None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:
            try:
                mine.close()
                _template_main(theirs)
            finally:
                os._exit(70)
        theirs.close()
        self.pid = pid
        self.pidfd = os.pidfd_open(pid)
        self.sock = mine

    def alive(self) -> bool:
        return not select.select([self.pidfd], [], [], 0)[0]

    def keep(self) -> frozenset[int]:
        """The pids a kill-all must spare: the template's, while it lives."""
        return frozenset((self.pid,)) if self.alive() else frozenset()

    def check(self, timeout: float = TEMPLATE_REPLY_S) -> None:
        """Raise ``TemplateGone`` unless the template answers within ``timeout`` (resumed
        first: the code may have stopped it)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGCONT)
        try:
            self.sock.send(b"ping")
            ready, _, _ = select.select([self.sock], [], [], timeout)
            reply = self.sock.recv(256) if ready else None
        except OSError as exc:
            raise TemplateGone(f"the template process is gone: {exc}") from exc
        if reply != b"pong":
            raise TemplateGone(f"the template process did not answer ({reply!r})")

    def fork_spare(self, fds: list[int]) -> int:
        """A new spare holding ``fds`` (the child's ends of its pipes): its pid. The spare
        is PID 1's child by the time this returns."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGCONT)  # code may have stopped it
        try:
            socket.send_fds(self.sock, [b"spare"], fds)
            ready, _, _ = select.select([self.sock], [], [], TEMPLATE_REPLY_S)
            reply = self.sock.recv(256) if ready else None
        except OSError as exc:
            raise TemplateGone(f"the template process is gone: {exc}") from exc
        if reply is None:
            raise TemplateGone("the template process did not answer")
        if not reply:
            raise TemplateGone("the template process is gone")
        if not reply.startswith(b"pid "):
            raise OSError(errno.EAGAIN, reply.decode("utf-8", "replace"))
        return int(reply[4:])


def _template_main(sock: socket.socket) -> NoReturn:
    """The template's life: fork a spare whenever PID 1 asks, until PID 1 is gone."""
    keep = sock.fileno()
    os.closerange(3, keep)  # PID 1's control channel and anything else it held
    os.closerange(keep + 1, MAX_FD)
    # the code of a stage runs as the same user and may signal us: ignore what can be
    # ignored (SIGKILL cannot: PID 1 then sees us gone); SIGCHLD stays default so that
    # couriers can be waited for
    for signum in signal.valid_signals():
        if signum not in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD):
            with contextlib.suppress(OSError, ValueError):
                signal.signal(signum, signal.SIG_IGN)
    sibling = _sibling_fork()
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(sock, 64, 8)
        except OSError:
            os._exit(71)
        if not message:
            os._exit(0)  # PID 1 is gone
        if message == b"ping":
            for fd in fds:
                os.close(fd)
            sock.send(b"pong")
            continue
        try:
            reply = f"pid {_fork_spare(fds, keep, sibling)}"
        except OSError as exc:
            reply = f"cannot fork a spare: {exc}"
        finally:
            for fd in fds:
                os.close(fd)
        sock.send(reply.encode())


class SiblingFork:
    """``fork()`` whose child is the caller's sibling: ``clone(CLONE_PARENT)`` through
    ``ctypes``, with the interpreter's own fork hooks around it.

    Python's ``os.fork`` takes no clone flags, and the spare must be PID 1's child. Without
    this the template forks a courier that forks the spare and exits; every fork and exit
    of a CPython image costs about its resident size in page-table work (1.8 ms for the
    template's 23 MB on this machine's nested paging, against 0.17 ms for a small C
    program: docs/benchmarks.md), so the courier doubled the cost of each call's process.

    What it does is what ``os.fork`` does (``PyOS_BeforeFork``, the system call with the
    interpreter lock held, ``PyOS_AfterFork_Child`` / ``_Parent``: the interpreter's
    locks, threads and ``os.register_at_fork`` hooks, ``random``'s reseed among them),
    with the system call glibc's ``fork()`` makes (``CLONE_CHILD_SETTID`` and
    ``CLONE_CHILD_CLEARTID`` on the thread descriptor's id, so ``pthread_kill`` and
    ``pthread_join`` in the child see its own id), plus ``CLONE_PARENT``. What glibc's
    ``fork()`` also does and this does not: run the ``pthread_atfork`` handlers of C
    libraries the template loaded, and register the child's robust-futex list. The
    template is single-threaded, and the one C library with such handlers it loads,
    OpenSSL (through ``hashlib``), still gives each child its own random stream (checked
    with Debian 12's: three spares forked this way after the template had drawn from
    ``ssl.RAND_bytes`` drew three different values).

    ``available()`` is False unless this is x86-64 and the thread descriptor holds the
    running thread's id where it is looked for; the template then uses the courier.
    """

    def __init__(self) -> None:
        import ctypes
        import threading

        self._ctypes = ctypes
        self._api = ctypes.pythonapi
        for name in ("PyOS_BeforeFork", "PyOS_AfterFork_Child", "PyOS_AfterFork_Parent"):
            getattr(self._api, name).restype = None
            getattr(self._api, name).argtypes = []
        # PyDLL: the interpreter lock stays held across the call, as in os.fork
        libc = ctypes.PyDLL(None, use_errno=True)
        self._syscall = libc.syscall
        self._syscall.restype = ctypes.c_long
        self._syscall.argtypes = [
            ctypes.c_long, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong
        ]  # fmt: skip
        self.tid_address = 0
        if os.uname().machine != "x86_64":
            return
        pthread_self = libc.pthread_self
        pthread_self.restype = ctypes.c_ulong
        address = int(pthread_self()) + GLIBC_TID_OFFSET_X86_64
        if ctypes.c_int.from_address(address).value == threading.get_native_id():
            self.tid_address = address

    def available(self) -> bool:
        return bool(self.tid_address)

    def fork(self) -> int:
        """0 in the child, the child's pid in the caller; OSError if the kernel refused."""
        flags = CLONE_PARENT | CLONE_CHILD_SETTID | CLONE_CHILD_CLEARTID | SIGCHLD
        self._api.PyOS_BeforeFork()
        pid = self._syscall(SYS_CLONE_X86_64, flags, 0, 0, self.tid_address)
        if pid == 0:
            self._api.PyOS_AfterFork_Child()
            return 0
        err = self._ctypes.get_errno()
        self._api.PyOS_AfterFork_Parent()
        if pid < 0:
            raise OSError(err, f"clone(CLONE_PARENT): {os.strerror(err)}")
        return int(pid)


def _sibling_fork() -> SiblingFork | None:
    try:
        forker = SiblingFork()
    except (OSError, AttributeError, ImportError) as exc:
        sys.stderr.write(f"zygote: spares go through a courier: {exc}\n")
        return None
    return forker if forker.available() else None


def _fork_spare(fds: list[int], sock_fd: int, sibling: SiblingFork | None = None) -> int:
    """Fork the spare as PID 1's child: directly with ``sibling``, else through a courier
    that forks it and exits (the orphaned spare goes to PID 1)."""
    if sibling is not None:
        spare = sibling.fork()
        if spare == 0:
            try:
                os.close(sock_fd)
                _spare_main(fds)
            finally:
                os._exit(126)
        return spare
    r, w = os.pipe()
    try:
        courier = os.fork()
    except OSError:
        os.close(r)
        os.close(w)
        raise
    if courier == 0:
        try:
            os.close(r)
            spare = os.fork()
            if spare == 0:
                os.close(w)
                os.close(sock_fd)
                _spare_main(fds)
            os.write(w, str(spare).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as pipe:
        data = pipe.read()
    os.waitpid(courier, 0)
    if not data:
        raise OSError(errno.EAGAIN, "the courier could not fork")
    return int(data)


def _spare_main(fds: list[int]) -> NoReturn:
    """A spare: wait for the stage on the go pipe, then become the stage's process."""
    try:
        _default_signals()  # PID 1's dispositions, not the template's
        out_w, err_w, st_w, go_r = fds
        stage = _await_stage(go_r)
        if stage is not None:
            _child(stage, (out_w, err_w, st_w))
    finally:
        os._exit(126)


def _await_stage(fd: int) -> dict[str, Any] | None:
    parts: list[bytes] = []
    while chunk := os.read(fd, CHUNK):
        parts.append(chunk)
    os.close(fd)
    if not parts:
        return None  # PID 1 is gone or dropped this spare
    stage = json.loads(b"".join(parts))
    return stage if isinstance(stage, dict) else None


class Spare:
    """PID 1's handle on a spare: forked by the template ahead of time (so the fork is
    off the call's critical path), blocked until it is handed its stage, used once."""

    def __init__(self, template: Template) -> None:
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        st_r, st_w = os.pipe2(os.O_CLOEXEC)
        go_r, go_w = os.pipe2(os.O_CLOEXEC)
        try:
            self.pid = template.fork_spare([out_w, err_w, st_w, go_r])
            self.pidfd = os.pidfd_open(self.pid)
        except BaseException:
            for fd in (out_r, err_r, st_r, go_w):
                os.close(fd)
            raise
        finally:
            for fd in (out_w, err_w, st_w, go_r):
                os.close(fd)
        self.fds = (out_r, err_r, st_r)
        self._go = go_w

    def start(self, stage: dict[str, Any]) -> bool:
        """Hand the stage over; False if the spare is gone (then discard it)."""
        data = json.dumps(stage).encode()
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._go, view) :]
        except OSError:
            return False
        finally:
            os.close(self._go)
        return True

    def discard(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)
        for fd in (self.pidfd, *self.fds):
            os.close(fd)


# --- running a stage ---------------------------------------------------------------------


class Capture:
    """Bounded capture of one pipe: keeps ``cap`` bytes, drains and drops the rest."""

    def __init__(self, fd: int, cap: int) -> None:
        self.fd = fd
        self.cap = cap
        self.data = bytearray()
        self.truncated = False
        self.open = True
        os.set_blocking(fd, False)

    def read(self) -> None:
        for _ in range(16):
            try:
                chunk = os.read(self.fd, CHUNK)
            except BlockingIOError:
                return
            if not chunk:
                self.open = False
                return
            room = self.cap - len(self.data)
            if room > 0:
                self.data += chunk[:room]
            if len(chunk) > room:
                self.truncated = True

    def text(self) -> str:
        return self.data.decode("utf-8", "replace")


def _jail_pids(exclude: frozenset[int]) -> list[tuple[int, bytes]]:
    """(pid, the rest of /proc/pid/stat after the command name) of every process in the
    jail but PID 1 and ``exclude``."""
    found: list[tuple[int, bytes]] = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or name == "1" or int(name) in exclude:
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                found.append((int(name), f.read().rsplit(b")", 1)[1]))
        except (OSError, IndexError):
            continue
    return found


def _other_processes(exclude: frozenset[int]) -> int:
    """Live processes in the jail besides PID 1 and ``exclude`` (zombies not counted)."""
    return sum(1 for _, stat_ in _jail_pids(exclude) if stat_.split()[:1] != [b"Z"])


def _jail_cpu_ms(exclude: frozenset[int], reaped_before: float) -> float:
    """CPU time of the jail's processes (``exclude`` aside) and of everything PID 1 has
    reaped since ``reaped_before`` was read: each live or dead-but-unreaped process's
    own time plus its waited-for children's (from /proc), and PID 1's reaped children's."""
    ticks = 0
    for _, stat_ in _jail_pids(exclude):
        with contextlib.suppress(ValueError, IndexError):
            ticks += sum(int(field) for field in stat_.split()[11:15])
    return ticks * 1000 / CLK_TCK + _reaped_cpu_ms() - reaped_before


def _jail_wait_ms(exclude: frozenset[int]) -> float | None:
    """How long the jail's threads (``exclude`` aside) have waited on a run queue: the
    run delay of /proc/PID/task/TID/schedstat, summed (None: the kernel does not say)."""
    total, seen = 0, False
    for pid, _ in _jail_pids(exclude):
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{pid}/task"):
                with (
                    contextlib.suppress(OSError, ValueError, IndexError),
                    open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f,
                ):
                    total += int(f.read().split()[1])
                    seen = True
    return total / 1e6 if seen else None


def _reaped_cpu_ms() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (usage.ru_utime + usage.ru_stime) * 1000


def _self_cpu_ms() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return (usage.ru_utime + usage.ru_stime) * 1000


def _kill_all(keep: frozenset[int]) -> None:
    """SIGKILL every process in the jail but PID 1 and ``keep`` (the template), and reap
    them all. Processes are listed from /proc and killed one by one (``kill(-1)`` would
    take the template too), again until none is left: what a dying process forked in
    between is found on the next round; the jail's pids limit bounds the rounds."""
    deadline = time.monotonic() + 5.0
    while True:
        others = _jail_pids(keep)
        for pid, _ in others:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
        if not others:
            return
        if time.monotonic() > deadline:
            raise RuntimeError("processes survive SIGKILL")
        time.sleep(0.0005)


def _launch(
    stage: dict[str, Any], spare: Spare | None, template: Template, cpu_fd: int | None
) -> tuple[Spare, int | None, float]:
    """A process running ``stage`` (the given spare, or a fresh one if it is unusable),
    and the jail's CPU counter and PID 1's own CPU time read just before it started."""
    for candidate in (spare, None):
        child = candidate if candidate is not None else Spare(template)
        cpu_mark, self_mark = _cgroup_cpu_ns(cpu_fd), _self_cpu_ms()
        if child.start(stage):
            return child, cpu_mark, self_mark
        child.discard()
    raise RuntimeError("cannot start a child")


def _cgroup_cpu_ns(fd: int | None) -> int | None:
    """The jail cgroup's CPU time (ns), read through the descriptor the host passed."""
    if fd is None:
        return None
    try:
        return int(os.pread(fd, 64, 0))
    except (OSError, ValueError):
        return None


def run_stage(
    stage: dict[str, Any],
    index: int,
    max_output: int,
    template: Template,
    spare: Spare | None = None,
    cpu_since: float | None = None,
    cpu_fd: int | None = None,
) -> dict[str, Any]:
    """Run one stage to its end and report it. ``stage["timeout"]`` is its wall-clock
    limit; ``stage["cpu_limit_ms"]``, when set, a limit on the CPU time of all of its
    processes, checked every ``CPU_TICK_S``. ``cpu_since``: PID 1's own CPU time when its
    work for this stage began (``zygote_cpu_ms`` is what it spent since). ``cpu_fd``: the
    jail's cgroup CPU counter; with it the report's ``cgroup_cpu_ms`` is the CPU time of
    the stage's processes, from just before the stage started to after the last of them
    was reaped, PID 1's own share left out."""
    self_before = _self_cpu_ms() if cpu_since is None else cpu_since
    keep = template.keep()
    reaped_before = _reaped_cpu_ms()
    try:
        child, cgroup_before, self_mark = _launch(stage, spare, template, cpu_fd)
    except (TemplateGone, OSError) as exc:
        return _unstarted(stage, index, f"cannot fork its process: {exc}")
    started = time.monotonic()
    pid, pidfd = child.pid, child.pidfd
    out_r, err_r, st_r = child.fds
    captures = [Capture(out_r, max_output), Capture(err_r, max_output), Capture(st_r, 4096)]
    by_fd = {c.fd: c for c in captures}
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    for capture in captures:
        poller.register(capture.fd, select.POLLIN)
    deadline = started + float(stage["timeout"])
    cpu_limit = stage.get("cpu_limit_ms")
    next_cpu_check = started + CPU_TICK_S
    timed_out = cpu_exceeded = exited = False
    wait_ms: float | None = None
    try:
        while not exited:
            now = time.monotonic()
            if now >= deadline:
                timed_out = True
                break
            if cpu_limit is not None and now >= next_cpu_check:
                next_cpu_check = now + CPU_TICK_S
                if _jail_cpu_ms(keep, reaped_before) >= float(cpu_limit):
                    cpu_exceeded = True
                    break
            wait = deadline - now if cpu_limit is None else min(deadline, next_cpu_check) - now
            for fd, _ in poller.poll(max(1, int(wait * 1000 + 1))):
                if fd == pidfd:
                    exited = True
                    continue
                capture = by_fd[fd]
                capture.read()
                if not capture.open:
                    poller.unregister(fd)
        if timed_out:  # was it waiting for a CPU, or sleeping? (before the kill)
            wait_ms = _jail_wait_ms(keep)
        if timed_out or cpu_exceeded:
            for target in (-pid, pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(target, signal.SIGKILL)
        _, status, usage = os.wait4(pid, 0)
        wall_ms = (time.monotonic() - started) * 1000
        leftover = _other_processes(keep)
        _kill_all(keep)
        # every writer is dead now: whatever is in the pipes ends with EOF
        drain_deadline = time.monotonic() + DRAIN_AFTER_EXIT_S
        while any(c.open for c in captures) and time.monotonic() < drain_deadline:
            for fd, _ in poller.poll(100):
                if fd in by_fd:
                    by_fd[fd].read()
                    if not by_fd[fd].open:
                        poller.unregister(fd)
    finally:
        os.close(pidfd)
        for capture in captures:
            os.close(capture.fd)
    report: dict[str, Any] = {
        "name": stage["name"],
        "exit_code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        "stdout": captures[0].text(),
        "stderr": captures[1].text(),
        "stdout_truncated": captures[0].truncated,
        "stderr_truncated": captures[1].truncated,
        "wall_ms": wall_ms,
        # the stage's process and the descendants it waited for; the host charges the
        # jail's cgroup instead, which counts every process
        "cpu_ms": (usage.ru_utime + usage.ru_stime) * 1000,
        "zygote_cpu_ms": _self_cpu_ms() - self_before,
        "cgroup_cpu_ms": None,
        "maxrss_kb": usage.ru_maxrss,
        "timed_out": timed_out,
        "wait_ms": wait_ms,
        "cpu_exceeded": cpu_exceeded,
        "cpu_limit_s": _cpu_rlimit(stage),
        "error": None,
        "start_failure": None,
        "leftover": leftover,
    }
    cgroup_after = _cgroup_cpu_ns(cpu_fd)
    if cgroup_before is not None and cgroup_after is not None:
        own_ms = _self_cpu_ms() - self_mark
        report["cgroup_cpu_ms"] = max(0.0, (cgroup_after - cgroup_before) / 1e6 - own_ms)
    note = bytes(captures[2].data).decode("utf-8", "replace")
    if note.startswith("X"):
        kind, _, message = note[1:].partition(":")
        # the first stage starts before any of the call's code has run; a later one may
        # fail to start because of what an earlier stage's code did (removed the work
        # dir, built a ./main that cannot be executed): that is the code's failure, unless
        # a toolchain (an absolute path) could not be executed
        toolchain = kind == "exec" and str(stage["argv"][0]).startswith("/")
        report["error" if index == 0 or toolchain else "start_failure"] = message
    return report


def _unstarted(stage: dict[str, Any], index: int, failure: str) -> dict[str, Any]:
    """The report of a stage whose process could not be forked: the platform's failure
    in the first stage (nothing of the call has run yet), the code's in a later one (an
    earlier stage's code may have killed the template)."""
    return {
        "name": stage["name"],
        "exit_code": None if index == 0 else 126,
        "signal": None,
        "stdout": "",
        "stderr": "",
        "wall_ms": 0.0,
        "cpu_ms": 0.0,
        "zygote_cpu_ms": 0.0,
        "cgroup_cpu_ms": None,
        "maxrss_kb": 0,
        "timed_out": False,
        "cpu_exceeded": False,
        "cpu_limit_s": _cpu_rlimit(stage),
        "error": failure if index == 0 else None,
        "start_failure": failure if index else None,
        "leftover": 0,
    }


def handle(
    request: dict[str, Any],
    channel: Channel,
    template: Template,
    spare: Spare | None,
    cpu_fd: int | None = None,
) -> dict[str, Any]:
    cpu_since = _self_cpu_ms()
    result: dict[str, Any] = {"op": "result", "id": request.get("id"), "stages": []}
    try:
        _prepare(request)
    except InputError as exc:
        if spare is not None:
            spare.discard()
        result["input_error"] = str(exc)
        return result
    except OSError as exc:  # ENOSPC, "a" and "a/b" both given, names too long, ...
        if spare is not None:
            spare.discard()
        result["input_error"] = f"cannot write the input files: {exc.strerror}"
        return result
    leftover = 0
    for index, stage in enumerate(request["stages"]):
        if index:
            # let the host move the jail's cgroup limits to this stage's, then go on
            channel.send({"op": "stage", "id": request.get("id"), "index": index})
            go = channel.recv()
            if not go or go.get("op") != "go" or go.get("id") != request.get("id"):
                raise ValueError(f"expected 'go' for stage {index}, got {go!r}")
            cpu_since = _self_cpu_ms()
        report = run_stage(
            stage,
            index,
            int(request["max_output"]),
            template,
            spare,
            cpu_since=cpu_since,
            cpu_fd=cpu_fd,
        )
        spare = None
        leftover += report["leftover"]
        result["stages"].append(report)
        failed = report["error"] or report["start_failure"] or report["exit_code"] != 0
        if failed or report["timed_out"] or report["cpu_exceeded"]:
            break
    result["leftover"] = leftover
    files, notes = _fetch(list(request.get("fetch", [])), int(request.get("max_fetch", 0)))
    result["files"] = files
    result["fetch_notes"] = notes
    return result


def _arguments(argv: list[str]) -> int | None:
    """``--cpu-fd N``: the descriptor of the jail's cgroup CPU counter, if passed."""
    if "--cpu-fd" in argv:
        return int(argv[argv.index("--cpu-fd") + 1])
    return None


def main() -> None:
    cpu_fd = _arguments(sys.argv)
    channel = _setup()
    template = Template()  # before any request: the pristine image every call forks from
    spare: Spare | None = Spare(template)
    channel.send(
        {
            "op": "ready",
            "python": "{}.{}.{}".format(*sys.version_info[:3]),
            "pid": os.getpid(),
            "vm_bytes": _vm_bytes(),
        }
    )
    while True:
        request = channel.recv()
        if request is None:
            return
        if request.get("op") != "run":
            raise ValueError(f"unknown op {request.get('op')!r}")
        invocation = request.get("id")
        try:
            result = handle(request, channel, template, spare, cpu_fd)
        finally:
            spare = None
            del request
        channel.send(result)
        del result
        ok = True
        try:
            _kill_all(template.keep())
            for root in WIPED:
                os.chmod(root, 0o1777)  # the code may have locked us out of our own dirs
                _wipe(root)
            _remove_sysv_ipc()
            if not template.alive():
                raise TemplateGone("the template process is gone (killed by the code?)")
            if cpu_fd is None:
                # the host reads the cgroup around the next call's stages: fork its
                # process now, so that the fork's CPU time is nobody's (and a fork
                # through the template is answered only by a living one)
                spare = Spare(template)
            else:
                # a SIGKILL the code sent may not have been delivered yet (the template
                # not scheduled since, on a busy machine): ``alive`` can still say yes.
                # An answer can not: the signal is delivered before the template runs.
                template.check()
        except Exception as exc:
            sys.stderr.write(f"zygote: cleanup after {invocation} failed: {exc}\n")
            ok = False
        channel.send({"op": "clean", "id": invocation, "ok": ok})
        if not ok:
            return
        if spare is None:
            # while the host has nothing for us: off the next call's critical path (its
            # CPU time is measured from just before its stage starts); should this fail,
            # the next stage forks its own and reports why it could not
            with contextlib.suppress(TemplateGone, OSError):
                spare = Spare(template)


if __name__ == "__main__":
    main()
