"""Output past a command's cap, drained by the kernel instead of read by the node.

Reading a flood (``yes``) in Python only to throw it away cost the node 0.6-0.9 of a core
on its event loop (security review, finding #11). Once a stream is past its cap,
``discard(transport)`` stops the transport reading the pipe and splices the pipe to
``/dev/null`` instead: the kernel moves the pages, no byte reaches Python. The pipe is
enlarged to ``PIPE_BYTES`` and drained at most once per ``INTERVAL_S``, so between two
drains a fast writer blocks on the full pipe: a flood past its cap costs the node a few
system calls per interval (it is discarded at up to ``PIPE_BYTES / INTERVAL_S``, about
100 MiB/s), and a command that prints a lot and then exits still gets every write done,
reaches its own exit and is reported with its own exit code (never SIGPIPE, never stuck
on a pipe nobody drains).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os

log = logging.getLogger(__name__)

#: the pipe's size while it is discarded (root may exceed /proc/sys/fs/pipe-max-size)
PIPE_BYTES = 1 << 20
#: at most one drain of the pipe per interval
INTERVAL_S = 0.01
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)


async def discard(transport: asyncio.ReadTransport) -> int:
    """Splice what comes through ``transport``'s pipe to ``/dev/null`` until its end of
    file, then close the transport; returns the bytes discarded. The transport stops
    reading for good (whatever its reader held is left there). Cancellation stops the
    draining and leaves the transport to its owner."""
    pipe = transport.get_extra_info("pipe")
    if pipe is None:
        raise ValueError("discard() needs the transport of a pipe")
    loop = asyncio.get_running_loop()
    transport.pause_reading()
    fd = pipe.fileno()
    with contextlib.suppress(OSError):
        fcntl.fcntl(fd, _F_SETPIPE_SZ, PIPE_BYTES)
    null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    ended: asyncio.Future[None] = loop.create_future()
    timer: asyncio.TimerHandle | None = None
    total = 0

    def drain() -> None:
        nonlocal total, timer
        loop.remove_reader(fd)
        while True:
            try:
                moved = os.splice(fd, null, PIPE_BYTES, flags=os.SPLICE_F_NONBLOCK)
            except BlockingIOError:
                break
            except OSError as exc:
                if not ended.done():
                    ended.set_exception(exc)
                return
            if moved == 0:  # every writer closed the pipe
                if not ended.done():
                    ended.set_result(None)
                return
            total += moved
        timer = loop.call_later(INTERVAL_S, loop.add_reader, fd, drain)

    loop.add_reader(fd, drain)
    try:
        await ended
    except OSError as exc:
        log.warning("discarding a command's output failed: %r", exc)
    finally:
        loop.remove_reader(fd)
        if timer is not None:
            timer.cancel()
        os.close(null)
    transport.close()
    return total
