"""The zygote: PID 1 of one jail, forking a fresh child for every call.

This file is not imported by the host. Its source is handed to the jail's own
interpreter (``/usr/bin/python3 -I -c SOURCE``, Debian's 3.11), so it uses the standard
library only and must stay compatible with Python 3.11.

Protocol, over the zygote's stdin/stdout (moved to private descriptors at start-up):
every message is a 4-byte big-endian length followed by that many bytes of UTF-8 JSON.

    zygote -> host  {"op": "ready", "python": "3.11.2", "pid": 1, "vm_bytes": N}
    host -> zygote  {"op": "run", "id": ..., "sources": {...}, "files": {...}, "stdin": "...",
                     "stages": [...], "fetch": [...], "max_output": N, "max_fetch": N}
    zygote -> host  {"op": "stage", "id": ..., "index": 1}   before each stage after the first
    host -> zygote  {"op": "go", "id": ...}                 (after moving the cgroup limits)
    zygote -> host  {"op": "result", "id": ..., "stages": [...], "files": {...}, ...}
    zygote -> host  {"op": "clean", "id": ..., "ok": true}      (work dir and /tmp wiped)

End of input makes the zygote exit. Being PID 1 of the jail's PID namespace, it cannot be
killed by the code it runs (the kernel drops signals to a namespace init that has no
handler), it adopts every orphan, and ``kill(-1, SIGKILL)`` from it empties the jail.
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
CHILD_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
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


class InputError(Exception):
    """The request names a bad path or carries undecodable data."""


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
    for signum in signal.valid_signals():
        if signum in (signal.SIGKILL, signal.SIGSTOP):
            continue
        action = signal.SIG_IGN if signum in (signal.SIGPIPE, signal.SIGXFSZ) else signal.SIG_DFL
        with contextlib.suppress(OSError, ValueError):
            signal.signal(signum, action)
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


def _vm_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


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


# --- the child ---------------------------------------------------------------------------


def _child(stage: dict[str, Any], fds: tuple[int, int, int], vm_base: int) -> NoReturn:
    """Runs in the forked child once it has its stage; never returns.

    ``fds`` are the write ends of the stdout, stderr and status pipes.
    """
    try:
        os.setsid()
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 20) for fd in fds]
        for target, fd in enumerate(high, start=1):
            os.dup2(fd, target)
        os.set_inheritable(STATUS_FD, False)
        os.closerange(STATUS_FD + 1, 1 << 16)
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
        cpu = _cpu_limit(stage)
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_FSIZE, (stage["fsize"], stage["fsize"]))
        resource.setrlimit(resource.RLIMIT_NOFILE, (stage["nofile"], stage["nofile"]))
        resource.setrlimit(resource.RLIMIT_NPROC, (stage["nproc"], stage["nproc"]))
        if stage.get("as_bytes"):
            limit = stage["as_bytes"] + (vm_base if python else 0)
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except BaseException as exc:  # report set-up failures as the stage's error
        _status(f"X{type(exc).__name__}: {exc}")
        os._exit(126)
    if python:
        _run_python(stage)
    try:
        os.execve(stage["argv"][0], stage["argv"], CHILD_ENV)
    except OSError as exc:
        _status(f"Xcannot execute {stage['argv'][0]}: {exc.strerror}")
    os._exit(127)


def _cpu_limit(stage: dict[str, Any]) -> int:
    """RLIMIT_CPU: a second beyond the wall clock, so a single busy process always meets
    the (clearer) wall-clock limit first and CPU time only stops multi-process burners."""
    return math.ceil(float(stage["timeout"])) + 1


def _status(message: str) -> None:
    with contextlib.suppress(OSError):
        os.write(STATUS_FD, message.encode("utf-8", "replace")[:4000])


def _run_python(stage: dict[str, Any]) -> NoReturn:
    """Run the user's code in this (forked, already initialised) interpreter."""
    import atexit
    import builtins
    import traceback
    import types

    filename = stage["filename"]
    path = os.path.join(WORK, filename)
    module = types.ModuleType("__main__")
    module.__dict__.update({"__file__": path, "__builtins__": builtins, "__cached__": None})
    sys.modules["__main__"] = module
    sys.argv = [filename]
    sys.path.insert(0, WORK)
    os.environ.clear()
    os.environ.update(CHILD_ENV)
    streams = {
        "stdin": open(0, encoding="utf-8", closefd=False),  # noqa: SIM115
        "stdout": open(1, "w", encoding="utf-8", closefd=False),  # noqa: SIM115
        "stderr": open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False),  # noqa: SIM115
    }
    for name, stream in streams.items():
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
    code = 0
    try:
        compiled = compile(stage["python"], path, "exec", dont_inherit=True)
        exec(compiled, module.__dict__)
    except SystemExit as exc:
        code = _exit_code(exc)
    except MemoryError as exc:
        _status("M")
        code = 1
        _print_exception(exc, traceback)
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
    except MemoryError:
        _status("M")
        code = 1
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


def _other_processes() -> int:
    """Live processes in the jail besides us (zombies excluded)."""
    count = 0
    for name in os.listdir("/proc"):
        if not name.isdigit() or name == "1":
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != b"Z":
            count += 1
    return count


def _kill_all() -> None:
    """SIGKILL every process in the jail but us, and reap them all."""
    deadline = time.monotonic() + 5.0
    while True:
        with contextlib.suppress(ProcessLookupError):
            os.kill(-1, signal.SIGKILL)
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                break
        if time.monotonic() > deadline:
            raise RuntimeError("processes survive SIGKILL")
        time.sleep(0.0005)


class Spare:
    """A child forked ahead of time from the idle zygote (so the fork is off the call's
    critical path), blocked until it is handed its stage, then used exactly once."""

    def __init__(self, vm_base: int) -> None:
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        st_r, st_w = os.pipe2(os.O_CLOEXEC)
        go_r, go_w = os.pipe2(os.O_CLOEXEC)
        pid = os.fork()
        if pid == 0:
            try:
                for fd in (out_r, err_r, st_r, go_w):
                    os.close(fd)
                stage = _await_stage(go_r)
                if stage is not None:
                    _child(stage, (out_w, err_w, st_w), vm_base)
            finally:
                os._exit(126)
        for fd in (out_w, err_w, st_w, go_r):
            os.close(fd)
        self.pid = pid
        self.pidfd = os.pidfd_open(pid)
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


def _await_stage(fd: int) -> dict[str, Any] | None:
    parts: list[bytes] = []
    while chunk := os.read(fd, CHUNK):
        parts.append(chunk)
    os.close(fd)
    if not parts:
        return None  # the zygote is gone or dropped this spare
    stage = json.loads(b"".join(parts))
    return stage if isinstance(stage, dict) else None


def _launch(stage: dict[str, Any], spare: Spare | None, vm_base: int) -> Spare:
    """A child running ``stage``: the given spare, or a fresh fork if it is unusable."""
    for candidate in (spare, None):
        child = candidate if candidate is not None else Spare(vm_base)
        if child.start(stage):
            return child
        child.discard()
    raise RuntimeError("cannot start a child")


def run_stage(
    stage: dict[str, Any], max_output: int, vm_base: int, spare: Spare | None = None
) -> dict[str, Any]:
    started = time.monotonic()
    child = _launch(stage, spare, vm_base)
    pid, pidfd = child.pid, child.pidfd
    out_r, err_r, st_r = child.fds
    captures = [Capture(out_r, max_output), Capture(err_r, max_output), Capture(st_r, 4096)]
    by_fd = {c.fd: c for c in captures}
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    for capture in captures:
        poller.register(capture.fd, select.POLLIN)
    deadline = started + float(stage["timeout"])
    timed_out = False
    exited = False
    try:
        while not exited:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            for fd, _ in poller.poll(max(1, int(remaining * 1000 + 1))):
                if fd == pidfd:
                    exited = True
                    continue
                capture = by_fd[fd]
                capture.read()
                if not capture.open:
                    poller.unregister(fd)
        if timed_out:
            for target in (-pid, pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(target, signal.SIGKILL)
        _, status, usage = os.wait4(pid, 0)
        wall_ms = (time.monotonic() - started) * 1000
        leftover = _other_processes()
        _kill_all()
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
        "cpu_ms": (usage.ru_utime + usage.ru_stime) * 1000,
        "maxrss_kb": usage.ru_maxrss,
        "timed_out": timed_out,
        "cpu_limit_s": _cpu_limit(stage),
        "memory_error": False,
        "error": None,
        "leftover": leftover,
    }
    note = bytes(captures[2].data).decode("utf-8", "replace")
    if note.startswith("M"):
        report["memory_error"] = True
    elif note.startswith("X"):
        report["error"] = note[1:]
    return report


def handle(
    request: dict[str, Any], vm_base: int, channel: Channel, spare: Spare | None
) -> dict[str, Any]:
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
        report = run_stage(stage, int(request["max_output"]), vm_base, spare)
        spare = None
        leftover += report["leftover"]
        result["stages"].append(report)
        if report["error"] or report["timed_out"] or report["exit_code"] != 0:
            break
    result["leftover"] = leftover
    files, notes = _fetch(list(request.get("fetch", [])), int(request.get("max_fetch", 0)))
    result["files"] = files
    result["fetch_notes"] = notes
    return result


def main() -> None:
    channel = _setup()
    vm_base = _vm_bytes()
    spare: Spare | None = Spare(vm_base)
    channel.send(
        {
            "op": "ready",
            "python": "{}.{}.{}".format(*sys.version_info[:3]),
            "pid": os.getpid(),
            "vm_bytes": vm_base,
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
            result = handle(request, vm_base, channel, spare)
        finally:
            spare = None
            del request
        channel.send(result)
        del result
        ok = True
        try:
            _kill_all()
            for root in WIPED:
                os.chmod(root, 0o1777)  # the code may have locked us out of our own dirs
                _wipe(root)
            _remove_sysv_ipc()
        except Exception as exc:
            sys.stderr.write(f"zygote: cleanup after {invocation} failed: {exc}\n")
            ok = False
        channel.send({"op": "clean", "id": invocation, "ok": ok})
        if not ok:
            return
        spare = Spare(vm_base)  # while the host has nothing for us


if __name__ == "__main__":
    main()
