"""User namespaces with a given id map, as descriptors: what an idmapped mount is made with.

The kernel makes a user namespace only for a process that asks (``unshare(2)``), and the
node is a threaded process, which cannot. So a short-lived helper (util-linux's
``unshare --user``, then a shell that waits) asks, the node writes the map into its
``/proc/<pid>/uid_map`` and ``gid_map`` (as host root: no ``setgroups`` denial needed),
opens ``/proc/<pid>/ns/user`` and lets the helper go; the descriptor keeps the namespace.
Namespaces are kept by map, a bounded number (a range's slot is reused by later
sandboxes, so most creates find theirs already made).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
from collections import OrderedDict

from node import threadspawn
from node.children import communicate
from node.sandboxes.base import BackendUnavailable

#: the helper: once its namespace exists it says so, then waits for its stdin to close
_HELPER = ("--user", "--", "/bin/sh", "-c", "echo; read -r _")
HELPER_WAIT_S = 10.0


class UserNamespaces:
    def __init__(self, *, keep: int = 256) -> None:
        self._keep = keep
        self._fds: OrderedDict[str, int] = OrderedDict()
        self._making: dict[str, asyncio.Future[int]] = {}

    async def get(self, mapping: str) -> int:
        """A descriptor of a user namespace whose uid and gid maps are ``mapping`` (one
        ``uid_map`` line); it stays open until ``close`` or eviction, so use it at once."""
        fd = self._fds.get(mapping)
        if fd is not None:
            self._fds.move_to_end(mapping)
            return fd
        making = self._making.get(mapping)
        if making is None:
            making = asyncio.ensure_future(_make(mapping))
            self._making[mapping] = making
            making.add_done_callback(lambda _: self._making.pop(mapping, None))
        fd = await asyncio.shield(making)
        if mapping not in self._fds:
            self._fds[mapping] = fd
            while len(self._fds) > self._keep:
                _, old = self._fds.popitem(last=False)
                os.close(old)
        return self._fds[mapping]

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


async def _make(mapping: str) -> int:
    try:
        proc = await threadspawn.start(  # not the loop's fork: see node.threadspawn
            shutil.which("unshare") or "/usr/bin/unshare",
            *_HELPER,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
    except OSError as exc:
        raise BackendUnavailable(f"cannot make a user namespace: {exc}") from exc
    assert proc.stdout is not None
    fd: int | None = None
    try:
        with contextlib.suppress(TimeoutError):
            if await asyncio.wait_for(proc.stdout.readline(), HELPER_WAIT_S) == b"\n":
                for name in ("uid_map", "gid_map"):
                    with open(f"/proc/{proc.pid}/{name}", "w") as f:  # noqa: ASYNC230 - procfs
                        f.write(mapping)
                fd = os.open(f"/proc/{proc.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        if fd is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        _, err = await communicate(proc, b"")  # its stdin closes: it ends
    if fd is None:
        detail = err.decode(errors="replace").strip() or "the helper did not start"
        raise BackendUnavailable(f"cannot make a user namespace: {detail}")
    return fd
