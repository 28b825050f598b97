"""A future of one's own, bounded by one timer on its loop.

``asyncio.wait_for`` around ``asyncio.shield`` makes a timeout context, a second future and
their callbacks for every wait: on the wasm path, per call, that was about 5 % of the
worker's Python work (docs/benchmarks-history.md, "Lighter instances, the transport's
frames together, a parametrised route found by prefix"). Where the awaited future is the
waiter's own, so nothing else needs it intact, one ``call_later`` that fails it with
``TimeoutError`` bounds the wait the same way.
"""

from __future__ import annotations

import asyncio
from typing import Any


def fail_after(delay: float, future: asyncio.Future[Any]) -> asyncio.TimerHandle:
    """Fail ``future`` with ``TimeoutError`` after ``delay`` seconds unless it is done by
    then; cancel the returned handle once the wait is over."""
    return future.get_loop().call_later(delay, _time_out, future)


def _time_out(future: asyncio.Future[Any]) -> None:
    if not future.done():
        future.set_exception(TimeoutError())
