"""``SiblingFork``: the template forks each spare as PID 1's child directly
(``clone(CLONE_PARENT)``), not through a courier."""

from __future__ import annotations

import os
import sys

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


class SiblingFork:
    """``fork()`` whose child is the caller's sibling: ``clone(CLONE_PARENT)`` through
    ``ctypes``, with the interpreter's own fork hooks around it.

    Python's ``os.fork`` takes no clone flags, and the spare must be PID 1's child. Without
    this the template forks a courier that forks the spare and exits; every fork and exit
    of a CPython image costs about its resident size in page-table work (1.8 ms for the
    template's 23 MB on this machine's nested paging, against 0.17 ms for a small C
    program: docs/benchmarks-history.md, "Where the jail's time went: the courier's second
    fork"), so the courier doubled the cost of each call's process.

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
