"""The freezer's settle, against a state file that stands in for the kernel's."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from node.sandboxes.crun.freezer import FreezeFailed, settle_frozen


def group(tmp_path: Path, state: str) -> Path:
    state_file = tmp_path / "sbx-1" / "freezer.state"
    state_file.parent.mkdir()
    state_file.write_text(state + "\n")
    return state_file


async def test_a_pause_waits_while_the_group_is_still_freezing(tmp_path: Path) -> None:
    state_file = group(tmp_path, "FREEZING")
    settled: list[str] = []

    async def kernel() -> None:
        for _ in range(5):  # several polls see FREEZING first
            await asyncio.sleep(0.01)
            assert not settled, "settled while the group was FREEZING"
        state_file.write_text("FROZEN\n")

    async def pause() -> None:
        await settle_frozen(state_file, timeout_s=5.0)
        settled.append(state_file.read_text().strip())

    await asyncio.gather(kernel(), pause())
    assert settled == ["FROZEN"]


async def test_a_group_that_does_not_freeze_is_thawed_and_the_pause_fails(
    tmp_path: Path,
) -> None:
    state_file = group(tmp_path, "FREEZING")
    with pytest.raises(FreezeFailed, match="did not freeze within"):
        await settle_frozen(state_file, timeout_s=0.05)
    assert state_file.read_text().strip() == "THAWED"


async def test_a_group_thawed_under_the_pause_fails_it_at_once(tmp_path: Path) -> None:
    state_file = group(tmp_path, "THAWED")
    with pytest.raises(FreezeFailed, match="thawed while"):
        await settle_frozen(state_file, timeout_s=60.0)
    assert state_file.read_text().strip() == "THAWED"


async def test_a_frozen_group_settles_without_a_sleep(tmp_path: Path) -> None:
    state_file = group(tmp_path, "FROZEN")
    await asyncio.wait_for(settle_frozen(state_file, timeout_s=0.0), timeout=1.0)
    assert state_file.read_text().strip() == "FROZEN"


async def test_a_pause_given_up_while_freezing_thaws_the_group(tmp_path: Path) -> None:
    state_file = group(tmp_path, "FREEZING")
    pause = asyncio.ensure_future(settle_frozen(state_file, timeout_s=60.0))
    await asyncio.sleep(0.02)
    assert not pause.done()
    pause.cancel()
    with pytest.raises(asyncio.CancelledError):
        await pause
    assert state_file.read_text().strip() == "THAWED"
