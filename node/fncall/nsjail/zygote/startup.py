"""PID 1's start-up (private channel descriptors, signals, the environment, not
dumpable, pre-imported modules) and two things every zygote process uses: the default
signal dispositions and its own mapped size."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import sys
from typing import Any

from node.fncall.nsjail.zygote.common import CHILD_ENV
from node.fncall.nsjail.zygote.framing import Channel

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
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
#: the C library, loaded by ``_setup`` (``cleanup._remove_sysv_ipc`` calls it too)
_LIBC: Any = None


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


def _libc() -> Any:
    """The C library as ``_setup`` loaded it (None before)."""
    return _LIBC


#: the signals ``_default_signals`` ignores, and those it sets to their default action:
#: plain numbers, listed once at start-up, so that a spare runs one system call per signal
#: and little else (a spare's every step is paid in copied pages: docs/benchmarks-history.md,
#: "The spare's signal reset from numbers listed at start-up")
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
