"""The freezer's settle, against a fake of the kernel's v1 freezer: the group's state is
what ``freezer.state`` reads; a write of ``THAWED`` thaws at once; a write of ``FROZEN``
starts a freeze that completes when the fake says so."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from node.sandboxes.crun import freezer
from node.sandboxes.crun.freezer import FreezeFailed, settle_frozen


class Kernel:
    def __init__(self, state_file: Path, state: str) -> None:
        self.state_file = state_file
        self.writes: list[str] = []
        self.complete = False  #: the next freeze asked for completes
        self.needs_a_thaw = False  #: a freeze completes only after a thaw (a stuck one)
        self._thawed = False
        state_file.parent.mkdir()
        self.set(state)

    def set(self, state: str) -> None:
        self.state_file.write_text(state + "\n")

    def read(self) -> str:
        return self.state_file.read_text().strip()

    def write(self, state_file: Path, state: str) -> None:
        assert state_file == self.state_file
        self.writes.append(state)
        if state == "THAWED":
            self._thawed = True
            self.set("THAWED")
        elif self.complete and (self._thawed or not self.needs_a_thaw):
            self.set("FROZEN")
        else:
            self.set("FREEZING")


@pytest.fixture
def kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Kernel:
    fake = Kernel(tmp_path / "sbx-1" / "freezer.state", "FREEZING")
    monkeypatch.setattr(freezer, "_write", fake.write)
    return fake


async def test_a_pause_waits_while_the_group_is_still_freezing(kernel: Kernel) -> None:
    pause = asyncio.ensure_future(settle_frozen(kernel.state_file, timeout_s=5.0))
    await asyncio.sleep(0.05)  # several polls see FREEZING
    assert not pause.done(), "settled while the group was FREEZING"
    kernel.complete = True
    await asyncio.wait_for(pause, 5)
    assert kernel.read() == "FROZEN"


async def test_a_stuck_freeze_is_asked_again_after_a_thaw(kernel: Kernel) -> None:
    """Fails with one write and polls: the group stays FREEZING until its timeout."""
    kernel.complete = kernel.needs_a_thaw = True
    await asyncio.wait_for(settle_frozen(kernel.state_file, timeout_s=5.0), 6)
    assert kernel.read() == "FROZEN"
    assert "THAWED" in kernel.writes and kernel.writes[-1] == "FROZEN"


async def test_a_group_that_does_not_freeze_is_thawed_and_the_pause_fails(
    kernel: Kernel,
) -> None:
    with pytest.raises(FreezeFailed, match="did not freeze within"):
        await settle_frozen(kernel.state_file, timeout_s=0.05)
    assert kernel.read() == "THAWED"


async def test_a_group_thawed_under_the_pause_fails_it_at_once(kernel: Kernel) -> None:
    kernel.set("THAWED")  # a resume came first
    with pytest.raises(FreezeFailed, match="thawed while"):
        await settle_frozen(kernel.state_file, timeout_s=60.0)
    assert kernel.read() == "THAWED" and kernel.writes == []


async def test_a_frozen_group_settles_without_a_sleep(kernel: Kernel) -> None:
    kernel.set("FROZEN")
    await asyncio.wait_for(settle_frozen(kernel.state_file, timeout_s=0.0), timeout=1.0)
    assert kernel.read() == "FROZEN" and kernel.writes == []


async def test_a_pause_given_up_while_freezing_thaws_the_group(kernel: Kernel) -> None:
    pause = asyncio.ensure_future(settle_frozen(kernel.state_file, timeout_s=60.0))
    await asyncio.sleep(0.02)
    assert not pause.done()
    pause.cancel()
    with pytest.raises(asyncio.CancelledError):
        await pause
    assert kernel.read() == "THAWED"
