"""Waiters: an outcome resolved before or during the wait is returned, a wait that runs
out returns None, and nothing is left behind either way."""

from __future__ import annotations

import asyncio

import pytest

from app.invocations.waiters import Waiters


async def test_an_outcome_resolved_before_the_wait_is_returned() -> None:
    waiters = Waiters()
    waiters.expect("inv_1")
    waiters.resolve("inv_1", {"status": "succeeded"})
    assert await waiters.wait("inv_1", 5.0) == {"status": "succeeded"}
    assert len(waiters) == 0


async def test_an_outcome_resolved_during_the_wait_is_returned() -> None:
    waiters = Waiters()
    waiting = asyncio.create_task(waiters.wait("inv_1", 5.0))
    await asyncio.sleep(0)
    waiters.resolve("inv_1", {"status": "failed"})
    assert await waiting == {"status": "failed"}
    assert len(waiters) == 0


async def test_a_wait_that_runs_out_returns_none_and_a_late_outcome_is_dropped() -> None:
    waiters = Waiters()
    assert await waiters.wait("inv_1", 0.05) is None
    assert len(waiters) == 0
    waiters.resolve("inv_1", {"status": "succeeded"})  # nobody waits: nothing is kept
    assert len(waiters) == 0


async def test_a_cancelled_wait_leaves_nothing() -> None:
    waiters = Waiters()
    waiting = asyncio.create_task(waiters.wait("inv_1", 5.0))
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert len(waiters) == 0
    waiters.resolve("inv_1", {"status": "succeeded"})
