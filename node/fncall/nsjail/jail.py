"""One jail: an nsjail process whose PID 1 is the zygote, and the host's end of its pipes.

A jail serves one call at a time. Anything unexpected (a malformed or oversized frame, a
reply for another call, the zygote exiting, a missed deadline) marks it *tainted*; the
pool then kills it instead of reusing it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import struct
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from node import threadspawn
from node.fncall.nsjail.cgroups import CgroupError, CgroupSetup, JailCgroup
from node.fncall.nsjail.command import JailCommand
from node.fncall.nsjail.jailcgroup import OUTSIDE_NPROC, V1JailCgroup

logger = logging.getLogger(__name__)

HEADER = struct.Struct(">I")
STDERR_TAIL_BYTES = 8192
KILL_WAIT_S = 5.0
#: lines the bundled nsjail binary's dynamic loader prints on every start
_NOISE = (b"no version information available",)


class JailError(RuntimeError):
    """The jail, not the code in it, failed."""


class JailStartError(JailError):
    pass


class JailDied(JailError):
    pass


class JailProtocolError(JailError):
    pass


class JailTimeout(JailError):
    pass


class Jail:
    """An nsjail process running the zygote, bound to at most one tenant."""

    def __init__(
        self,
        *,
        jail_id: str,
        language: str,
        command: JailCommand,
        cgroups: CgroupSetup,
        extra_ro_binds: Sequence[str],
        initial_memory_bytes: int,
        max_frame_bytes: int,
        tenant: str | None = None,
    ) -> None:
        self.id = jail_id
        self.language = language
        self.tenant = tenant
        self.uses = 0
        self.tainted: str | None = None
        self.started_at = time.monotonic()
        self.zygote_pid: int | None = None
        self.vm_bytes = 0
        #: memory the jail held when it became ready (its cgroup's usage, else the
        #: zygote's address space): what a warm, idle jail costs
        self.ready_memory_bytes = 0
        self.start_cpu_ms = 0.0  #: the jail's CPU until ready (nsjail's set-up, PID 1's)
        self.cgroup: JailCgroup | None = None
        self._command = command
        self._cgroups = cgroups
        self._extra_ro_binds = tuple(extra_ro_binds)
        self._initial_memory_bytes = initial_memory_bytes
        self._max_frame_bytes = max_frame_bytes
        self._proc: threadspawn.Child | None = None
        self._stderr_task: asyncio.Task[None] | None = None
        self._stderr_tail = bytearray()
        self._zygote_pidfd: int | None = None
        self._killed = False
        self._kill_task: asyncio.Future[None] | None = None
        self._settling: asyncio.Future[None] | None = None
        self._busy = False

    def __repr__(self) -> str:
        return f"<Jail {self.id} {self.language} tenant={self.tenant} uses={self.uses}>"

    @property
    def hostname(self) -> str:
        return f"corral-{self.id}"

    @property
    def alive(self) -> bool:
        return (
            not self._killed
            and self.tainted is None
            and self._proc is not None
            and self._proc.returncode is None
        )

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def stderr_tail(self) -> str:
        lines = [
            line
            for line in bytes(self._stderr_tail).splitlines()
            if not any(noise in line for noise in _NOISE)
        ]
        return b"\n".join(lines).decode("utf-8", "replace").strip()

    # --- life cycle ----------------------------------------------------------------------

    async def start(self, timeout_s: float) -> None:
        try:
            # the cgroups, fork and exec on a thread: none of it waits on the event loop
            self._proc = await threadspawn.launch(self._launch)
        except BaseException:
            await self.kill()  # removes the groups made (a cancelled start's too)
            raise
        assert self._proc.stderr is not None
        self._stderr_task = asyncio.create_task(self._drain_stderr(self._proc.stderr))
        try:
            async with asyncio.timeout(timeout_s):
                ready = await self._recv()
            if ready.get("op") != "ready" or ready.get("pid") != 1:
                raise JailProtocolError(f"unexpected greeting {ready!r}")
            self.vm_bytes = int(ready.get("vm_bytes", 0))
            self._attach_zygote()
            if self.cgroup is not None:
                self.cgroup.end_start()  # before any call: no user code at a start's weight
            used = self.cgroup.memory_bytes() if self.cgroup is not None else None
            self.ready_memory_bytes = used if used is not None else self.vm_bytes
            cpu_ns = self.cgroup.cpu_usage_ns() if self.cgroup is not None else None
            self.start_cpu_ms = cpu_ns / 1e6 if cpu_ns is not None else 0.0
        except BaseException as exc:
            await self.kill()
            if isinstance(exc, JailError | TimeoutError | CgroupError | OSError):
                detail = self.stderr_tail() or str(exc) or type(exc).__name__
                raise JailStartError(f"jail {self.id} failed to start: {detail}") from exc
            raise
        logger.debug(
            "jail %s (%s) ready: nsjail pid %s, zygote pid %s",
            self.id,
            self.language,
            self.pid,
            self.zygote_pid,
        )

    def _launch(self) -> subprocess.Popen[bytes]:
        """On a spawn thread: make the jail's v1 groups, then start nsjail in them."""
        config = self._command.config
        try:
            # v1: the jail's groups exist before nsjail, which starts inside them
            self.cgroup = self._cgroups.for_new_jail(
                self.id,
                memory_bytes=self._initial_memory_bytes,
                pids=config.max_pids_per_jail + OUTSIDE_NPROC,
                cpu_ms_per_sec=config.cpu_ms_per_sec,
            )
        except CgroupError as exc:
            raise JailStartError(f"jail {self.id} failed to start: {exc}") from exc
        join: list[Path] = []
        cpu_fd: int | None = None
        try:
            if isinstance(self.cgroup, V1JailCgroup):
                join = self.cgroup.procs_files()
                if self.cgroup.cpu_counter is not None:
                    # the zygote reads the jail's CPU counter itself, at the exact start
                    # and end of each stage, through this read-only descriptor
                    cpu_fd = os.open(self.cgroup.cpu_counter, os.O_RDONLY | os.O_CLOEXEC)
            argv = self._command.argv(
                hostname=self.hostname,
                extra_ro_binds=self._extra_ro_binds,
                initial_memory_bytes=self._initial_memory_bytes,
                join_cgroups=join,
                cpu_fd=cpu_fd,
            )
            try:
                return subprocess.Popen(
                    argv,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    env={"PATH": "/usr/bin:/bin"},
                    start_new_session=True,
                    pass_fds=(cpu_fd,) if cpu_fd is not None else (),
                )
            except OSError as exc:
                raise JailStartError(f"cannot execute nsjail {argv[0]}: {exc}") from exc
        except BaseException:
            if self.cgroup is not None:
                self.cgroup.remove()
                self.cgroup = None
            raise
        finally:
            if cpu_fd is not None:
                os.close(cpu_fd)

    def _attach_zygote(self) -> None:
        """Find the zygote's host pid (nsjail's only child), pin it with a pidfd, and
        (v2) find its cgroup."""
        assert self._proc is not None
        parent = self._proc.pid
        zygote = _only_child(parent)
        if zygote is None:
            raise JailStartError(f"nsjail {parent} has no jailed child")
        pidfd = os.pidfd_open(zygote)
        if _parent_of(zygote) != parent:  # the pid was reused between lookup and open
            os.close(pidfd)
            raise JailStartError(f"jailed child {zygote} of nsjail {parent} vanished")
        self._zygote_pidfd = pidfd
        self.zygote_pid = zygote
        if self.cgroup is None:
            self.cgroup = self._cgroups.for_running_jail(zygote)

    async def kill(self) -> None:
        """Kill every process of the jail and release its pipes and cgroups.

        Idempotent; every caller waits for the one kill, which a cancelled caller does
        not interrupt.
        """
        self._killed = True
        if self._kill_task is None:
            self._kill_task = asyncio.ensure_future(self._kill())
        await asyncio.shield(self._kill_task)

    async def _kill(self) -> None:
        if self._settling is not None and not self._settling.done():
            self._settling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._settling
        proc = self._proc
        if proc is None:
            await self._remove_cgroup()
            return
        # SIGKILL to PID 1 of the namespace takes down everything in the jail; nsjail then
        # reaps it, removes the jail's cgroups and exits. Before the zygote is known (a
        # start being cancelled), SIGTERM makes nsjail do the same for whatever it started.
        child: int | None = None
        if self._zygote_pidfd is None and proc.returncode is None:
            child = _only_child(proc.pid)
            if child is not None:
                with contextlib.suppress(OSError):
                    self._zygote_pidfd = os.pidfd_open(child)
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
        elif self._zygote_pidfd is not None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._zygote_pidfd, signal.SIGKILL)
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            async with asyncio.timeout(KILL_WAIT_S):
                await proc.wait()
        except TimeoutError:
            logger.warning("nsjail %s of jail %s did not exit; killing it", proc.pid, self.id)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()  # its child dies with it (PR_SET_PDEATHSIG)
            await proc.wait()
        # Drain what is left so the pipe transports see EOF and close.
        if proc.stdout is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(KILL_WAIT_S):
                    while await proc.stdout.read(1 << 16):
                        pass
        if self._stderr_task is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(KILL_WAIT_S):
                    await self._stderr_task
            if not self._stderr_task.done():
                self._stderr_task.cancel()
        proc.close()
        if self._zygote_pidfd is not None:
            # the jailed child must not outlive nsjail (it cannot: PR_SET_PDEATHSIG and
            # the PID namespace both kill it; this is belt and braces)
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._zygote_pidfd, signal.SIGKILL)
            os.close(self._zygote_pidfd)
            self._zygote_pidfd = None
        # v1: the host's own groups, empty now that nsjail has exited; v2: normally
        # already gone (nsjail removes them)
        await self._remove_cgroup()
        logger.debug("jail %s killed (nsjail exit %s)", self.id, proc.returncode)

    async def _remove_cgroup(self) -> None:
        """Close the jail's control files, then rmdir its groups on a spawn thread (a v1
        memory group's rmdir waits for the kernel to move its charges)."""
        if self.cgroup is not None:
            self.cgroup.close_files()
            await threadspawn.run_off_loop(self.cgroup.remove_groups)

    # --- calls ---------------------------------------------------------------------------

    async def call(
        self,
        request: dict[str, Any],
        *,
        timeout_s: float,
        on_stage: Callable[[int], None] | None = None,
    ) -> dict[str, Any]:
        """Send one ``run`` request and return the zygote's ``result``.

        Before each stage after the first the zygote pauses; ``on_stage(index)`` runs
        (to move the cgroup limits) and the zygote is told to go on.
        """
        if not await self.settled():
            raise JailDied(f"jail {self.id} is not usable ({self.tainted or 'dead'})")
        if self._busy:
            raise JailProtocolError(f"jail {self.id} is already serving a call")
        self._busy = True
        self.uses += 1
        invocation = request.get("id")
        try:
            async with asyncio.timeout(timeout_s):
                await self._send(request)
                result = await self._recv()
                while result.get("op") == "stage" and result.get("id") == invocation:
                    if on_stage is not None:
                        on_stage(int(result.get("index", 0)))
                    await self._send({"op": "go", "id": invocation})
                    result = await self._recv()
        except TimeoutError:
            self.tainted = f"no reply within {timeout_s:.1f}s"
            raise JailTimeout(f"jail {self.id} did not answer within {timeout_s:.1f}s") from None
        except JailError as exc:
            self.tainted = str(exc)
            raise
        finally:
            self._busy = False
        if result.get("op") != "result" or result.get("id") != invocation:
            self.tainted = "reply for another call"
            raise JailProtocolError(f"jail {self.id} sent an unexpected reply")
        return result

    def settle_later(self, invocation: str, *, timeout_s: float) -> None:
        """Collect the zygote's clean-up report in the background: the caller has its
        result already, and the next call on this jail waits in ``settled()``."""
        self._settling = asyncio.ensure_future(self._settle(invocation, timeout_s))

    async def settled(self) -> bool:
        """Wait for the previous call's clean-up; True if the jail is still usable."""
        if self._settling is not None:
            await asyncio.shield(self._settling)
            self._settling = None
        return self.alive

    async def _settle(self, invocation: str, timeout_s: float) -> None:
        with contextlib.suppress(JailError):  # finish() has tainted the jail
            await self.finish(invocation, timeout_s=timeout_s)

    async def finish(self, invocation: str, *, timeout_s: float) -> None:
        """Wait until the zygote has wiped the call's files and processes."""
        try:
            async with asyncio.timeout(timeout_s):
                clean = await self._recv()
        except TimeoutError:
            self.tainted = "clean-up timed out"
            raise JailTimeout(f"jail {self.id} did not clean up within {timeout_s:.1f}s") from None
        except JailError as exc:
            self.tainted = str(exc)
            raise
        if clean.get("op") != "clean" or clean.get("id") != invocation:
            self.tainted = "unexpected clean-up message"
            raise JailProtocolError(f"jail {self.id} sent an unexpected clean-up message")
        if clean.get("ok") is not True:
            self.tainted = "clean-up failed"

    # --- framing -------------------------------------------------------------------------

    async def _send(self, message: dict[str, Any]) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        body = json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode()
        try:
            self._proc.stdin.write(HEADER.pack(len(body)) + body)
            await self._proc.stdin.drain()
        except (ConnectionError, RuntimeError) as exc:
            raise JailDied(f"jail {self.id} closed its input: {exc}") from exc

    async def _recv(self) -> dict[str, Any]:
        assert self._proc is not None and self._proc.stdout is not None
        try:
            header = await self._proc.stdout.readexactly(HEADER.size)
            (size,) = HEADER.unpack(header)
            if size > self._max_frame_bytes:
                raise JailProtocolError(f"jail {self.id} sent a {size}-byte frame")
            body = await self._proc.stdout.readexactly(size)
        except asyncio.IncompleteReadError:
            raise JailDied(f"jail {self.id} exited{self._exit_detail()}") from None
        try:
            message = json.loads(body)
        except ValueError as exc:
            raise JailProtocolError(f"jail {self.id} sent malformed JSON") from exc
        if not isinstance(message, dict):
            raise JailProtocolError(f"jail {self.id} sent a non-object frame")
        return message

    def _exit_detail(self) -> str:
        tail = self.stderr_tail()
        return f": {tail[-500:]}" if tail else ""

    async def _drain_stderr(self, stream: asyncio.StreamReader) -> None:
        """Keep the last few KiB of nsjail's and the zygote's stderr for diagnostics."""
        while chunk := await stream.read(1 << 16):
            self._stderr_tail += chunk
            if len(self._stderr_tail) > STDERR_TAIL_BYTES:
                del self._stderr_tail[: len(self._stderr_tail) - STDERR_TAIL_BYTES]


def _only_child(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            children = [int(p) for p in f.read().split()]
    except (OSError, ValueError):
        children = [p for p in _all_pids() if _parent_of(p) == pid]
    return children[0] if len(children) == 1 else None


def _all_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None
