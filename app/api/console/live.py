"""Live updates for console pages: server-sent events of one figure set, sent again
every few seconds until the thing watched is done or the stream's time is up (then the
browser's ``EventSource`` reconnects after ``retry``, if the page still wants it). No
connection is held open for ever: a gateway's shutdown waits for open streams."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.responses import StreamingResponse

from app.errors import CorralError

#: a stream ends after this long
LIVE_FOR_S = 60.0

Read = Callable[[], Awaitable[dict[str, Any]]]


def events(
    event: str,
    read: Read,
    *,
    every_s: float,
    done: Callable[[dict[str, Any]], bool] = lambda _: False,
    first: dict[str, Any] | None = None,
) -> StreamingResponse:
    """An ``event`` with ``read()``'s figures every ``every_s``; the last one is the first
    that is ``done`` (``first``: figures already read, sent at once)."""

    async def stream() -> AsyncIterator[str]:
        ends = time.monotonic() + LIVE_FOR_S
        yield f"retry: {int(every_s * 1000)}\n\n"
        figures = first if first is not None else await read()
        while True:
            yield f"event: {event}\ndata: {json.dumps(figures)}\n\n"
            if done(figures) or time.monotonic() >= ends:
                if done(figures):
                    yield "event: done\ndata: {}\n\n"
                return
            await asyncio.sleep(every_s)
            try:
                figures = await read()
            except CorralError:  # gone meanwhile (deleted, its tenant's key revoked)
                yield "event: done\ndata: {}\n\n"
                return

    return StreamingResponse(
        stream(), media_type="text/event-stream", headers={"Cache-Control": "no-store"}
    )
