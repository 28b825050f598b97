"""``fail_after``: a future not done in time fails with ``TimeoutError``; one done in time
is left as it is."""

from __future__ import annotations

import asyncio

import pytest

from node.timeouts import fail_after

pytestmark = pytest.mark.asyncio


async def test_a_future_not_done_in_time_fails_with_timeout_error() -> None:
    future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    fail_after(0.01, future)
    with pytest.raises(TimeoutError):
        await future


async def test_a_future_done_in_time_keeps_its_result() -> None:
    future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    timer = fail_after(0.05, future)
    future.set_result(7)
    await asyncio.sleep(0.1)  # the timer fires on a done future: nothing changes
    assert future.result() == 7
    timer.cancel()
