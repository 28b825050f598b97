"""A child process started from a thread, then driven from asyncio.

``asyncio.create_subprocess_exec`` forks and execs on the event loop's thread: the loop
waits until the child has exec'd (``subprocess.Popen`` reads its error pipe), and the
set-up a caller does before (a jail's cgroups) is file-system work on the loop too. Under
a burst of starts on a busy machine those waits add up to whole seconds during which
nothing else the process serves moves. ``launch(prepare)`` runs ``prepare`` (which
builds the ``subprocess.Popen``, and whatever must come before it) on a small pool of
threads of its own, then connects the child's pipes to the loop as asyncio streams and
watches its exit through a pidfd: nothing of a start runs on the loop but those few
calls.

``start(*argv)`` is the short form for a plain command (a runtime's ``crun run``, ``nft``):
under uvloop, ``asyncio.create_subprocess_exec`` forks the whole node process on the
loop's thread (libuv has no vfork on Linux), which costs milliseconds of CPU per command
in a process of a few hundred MB, and a sandbox's create and destroy run several such
commands; ``subprocess.Popen`` on these threads uses vfork and costs a fraction of one.

A caller cancelled while ``prepare`` runs still gets nothing half-made: the cancellation
waits for ``prepare`` to return, then ``Child.abandon`` kills and reaps the child (off
the loop) before it goes on; ``prepare`` must release what it made itself if it raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor

from node.pipes import PipeReader, PipeWriter

log = logging.getLogger(__name__)

#: threads that run ``prepare`` (a start's file-system work, fork and exec); the pools
#: bound how many starts are in flight, so a few threads are enough
THREADS = 4
_threads = ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="corral-spawn")


def run_off_loop[T](fn: Callable[[], T]) -> asyncio.Future[T]:
    """``fn()`` on the spawn threads (for a start's or a stop's blocking file-system
    work); the caller awaits the result."""
    return asyncio.get_running_loop().run_in_executor(_threads, fn)


class Child:
    """A running child: ``stdin`` as a ``PipeWriter``, ``stdout``/``stderr`` as
    ``StreamReader``-s (None where the Popen has no pipe; ``node.pipes``), ``wait()``
    for its exit."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self._popen = popen
        self.pid = popen.pid
        self.stdin: PipeWriter | None = None
        self.stdout: asyncio.StreamReader | None = None
        self.stderr: asyncio.StreamReader | None = None
        self._pidfd: int | None = None
        self._readers: list[PipeReader] = []
        self._exited: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    @property
    def returncode(self) -> int | None:
        return self._popen.returncode

    async def _attach(self) -> None:
        loop = asyncio.get_running_loop()
        popen = self._popen
        self._pidfd = os.pidfd_open(self.pid)
        loop.add_reader(self._pidfd, self._on_exit)
        self._on_exit()  # it may have exited already
        if popen.stdin is not None:
            self.stdin = PipeWriter(os.dup(popen.stdin.fileno()))
            popen.stdin.close()
        for name in ("stdout", "stderr"):
            pipe = getattr(popen, name)
            if pipe is None:
                continue
            reader = asyncio.StreamReader(loop=loop)
            self._readers.append(PipeReader(os.dup(pipe.fileno()), reader))
            pipe.close()
            setattr(self, name, reader)

    def close(self) -> None:
        """Close the node's ends of the child's pipes (once it is done with them)."""
        if self.stdin is not None:
            self.stdin.close()
        for reading in self._readers:
            reading.close()
        self._readers.clear()

    def _on_exit(self) -> None:
        if self._popen.poll() is None:
            return
        self._close_pidfd()
        if not self._exited.done():
            self._exited.set_result(self._popen.returncode)

    def _close_pidfd(self) -> None:
        if self._pidfd is not None:
            with contextlib.suppress(ValueError, RuntimeError):
                asyncio.get_running_loop().remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None

    async def wait(self) -> int:
        """Its exit status, once it has exited (reaped)."""
        return await asyncio.shield(self._exited)

    def send_signal(self, sig: int) -> None:
        if self._popen.returncode is None:
            self._popen.send_signal(sig)  # polls first: never signals a reaped pid

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    async def communicate(self, data: bytes | None = None) -> tuple[bytes, bytes]:
        """As ``asyncio.subprocess.Process.communicate``: ``data`` to its stdin (then
        closed), all of its stdout and stderr, once it has exited; its pipes closed."""
        try:
            if self.stdin is not None:
                if data:
                    self.stdin.write(data)
                    with contextlib.suppress(ConnectionError):
                        await self.stdin.drain()
                self.stdin.close()
            out, err = await asyncio.gather(_all_of(self.stdout), _all_of(self.stderr))
            await self.wait()
            return out, err
        finally:
            self.close()


async def _all_of(stream: asyncio.StreamReader | None) -> bytes:
    return b"" if stream is None else await stream.read()


async def start(
    *argv: str,
    stdin: int = subprocess.DEVNULL,
    stdout: int = subprocess.DEVNULL,
    stderr: int = subprocess.DEVNULL,
    pass_fds: tuple[int, ...] = (),
) -> Child:
    """Start the command ``argv`` (``subprocess.PIPE`` for the streams to talk through)."""
    return await launch(
        lambda: subprocess.Popen(
            list(argv), stdin=stdin, stdout=stdout, stderr=stderr, pass_fds=pass_fds
        )
    )


async def launch(prepare: Callable[[], subprocess.Popen[bytes]]) -> Child:
    """Run ``prepare`` on the spawn threads and drive the child it started from the loop.

    ``prepare`` returns the started ``Popen`` (its pipes, if any, become the ``Child``'s
    streams) or raises, having released what it made. If the caller is cancelled
    meanwhile, ``prepare`` is still waited for, and the child it started killed and
    reaped, before the cancellation goes on.
    """
    started = run_off_loop(prepare)
    try:
        popen = await asyncio.shield(started)
    except asyncio.CancelledError:
        await _unwinding(_reaped_once_started(started))
        raise
    child = Child(popen)
    try:
        await child._attach()
    except BaseException:
        child.close()
        child._close_pidfd()
        await _unwinding(_reaped(popen))
        raise
    return child


async def _reaped_once_started(started: asyncio.Future[subprocess.Popen[bytes]]) -> None:
    """Once ``prepare`` returned: kill, close and reap what it started."""
    await asyncio.wait({started})
    if not started.cancelled() and started.exception() is None:
        await _reaped(started.result())


async def _reaped(popen: subprocess.Popen[bytes]) -> None:
    """Kill the child, close its pipes and reap it, on the spawn threads."""

    def reap() -> None:
        with contextlib.suppress(OSError):
            popen.kill()
        for pipe in (popen.stdin, popen.stdout, popen.stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        popen.wait()

    await run_off_loop(reap)


async def _unwinding(cleanup: Awaitable[None]) -> None:
    """Run ``cleanup`` to its end for a caller that is being cancelled: further
    cancellations wait for it too (the caller's own cancellation goes on after)."""
    task = asyncio.ensure_future(cleanup)
    while not task.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait({task})
    if not task.cancelled() and task.exception() is not None:
        log.warning("cleaning up a start given up half-way failed: %r", task.exception())
