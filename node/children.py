"""Running a host command to its end from asyncio, even when the caller is cancelled.

``proc.communicate()`` cancelled (a node shutting down, a request abandoned) leaves the
child running and its Popen unreaped; once the event loop closes, nothing ever reaps it.
A runtime command (``crun create``, ``nft``) cut half-way also leaves half a change on
the host. So a cancelled caller still lets the command finish, for a bounded time, then
kills it, and in every case reaps it before the cancellation goes on."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Protocol

log = logging.getLogger(__name__)

#: how long a command whose caller was cancelled may still run before it is killed
CANCEL_GRACE_S = 5.0


class Talking(Protocol):
    """A started command (``asyncio.subprocess.Process``, ``threadspawn.Child``)."""

    pid: int

    async def communicate(self, data: bytes | None = None, /) -> tuple[bytes, bytes]: ...
    async def wait(self) -> int: ...
    def kill(self) -> None: ...


async def communicate(
    proc: Talking,
    data: bytes | None = None,
    *,
    grace_s: float = CANCEL_GRACE_S,
) -> tuple[bytes, bytes]:
    """``proc.communicate(data)``; if the caller is cancelled, ``proc`` is given
    ``grace_s`` to end, killed after that, and reaped before the cancellation goes on."""
    talk = asyncio.ensure_future(proc.communicate(data))
    try:
        return await asyncio.shield(talk)
    except asyncio.CancelledError:
        _, pending = await asyncio.wait({talk}, timeout=grace_s)
        if pending:
            log.warning("pid %s: killed, its caller was cancelled %.0f s ago", proc.pid, grace_s)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            talk.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await talk
        elif not talk.cancelled():
            talk.exception()  # retrieved: the caller is gone, nobody else will
        raise
