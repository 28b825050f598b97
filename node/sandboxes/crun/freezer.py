"""The v1 freezer's settle: a pause is done when the kernel says ``FROZEN``.

Writing ``FROZEN`` to ``freezer.state`` only starts a freeze: the group reads
``FREEZING`` until every task in it has stopped, which under load, or with a task in an
uninterruptible sleep, takes a while. ``crun pause`` (1.8 on cgroup v1) writes the file
and returns at once, as ``freeze`` here does (the backend writes it itself, with no
runtime process), so a pause that must hold (a warm sandbox costing no CPU, a
snapshot copying a still layer) waits here for the state to settle. A group that does
not settle in time is thawed again and the pause fails: half-frozen is not a state a
caller can rely on.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from node.sandboxes.base import SandboxError

FREEZE_TIMEOUT_S = 5.0
_FIRST_POLL_S = 0.0005
_LAST_POLL_S = 0.02
#: every this many polls still ``FREEZING``, the group is thawed for ``KICK_THAWED_S``
#: and frozen again
KICK_EVERY = 10
KICK_THAWED_S = 0.01


class FreezeFailed(SandboxError):
    """The sandbox could not be paused; it runs on (the gateway answers 409 ``conflict``)."""

    status, code = 409, "pause_failed"


def freeze(state_file: Path) -> None:
    """Start freezing the group (``settle_frozen`` waits for it to hold)."""
    _write(state_file, "FROZEN")


def thaw(state_file: Path) -> None:
    """Thaw the group: its tasks run again at once."""
    _write(state_file, "THAWED")


async def settle_frozen(state_file: Path, *, timeout_s: float = FREEZE_TIMEOUT_S) -> None:
    """Return once ``state_file`` reads ``FROZEN``; after ``timeout_s``, or if cancelled
    first, thaw the group and raise (``FreezeFailed``, or the cancellation). A
    ``THAWED`` reading means the freeze was undone (a resume won the race):
    ``FreezeFailed`` at once, the group left as it is.

    A v1 freeze can stall in ``FREEZING`` (a task caught between fork and exec, or one
    the kernel skipped while it slept): each poll that still reads it asks for the freeze
    again, and every ``KICK_EVERY`` polls the group is thawed and frozen afresh, as
    runc's own freeze does (one write and polls left a runc container ``FREEZING`` for
    5 s under a loaded test run)."""
    deadline = time.monotonic() + timeout_s
    poll = _FIRST_POLL_S
    polls = 0
    while True:
        state = _read(state_file)
        if state == "FROZEN":
            return
        if state == "THAWED":
            raise FreezeFailed(f"{state_file.parent.name} was thawed while it was being frozen")
        if time.monotonic() >= deadline:
            _write(state_file, "THAWED")
            raise FreezeFailed(
                f"{state_file.parent.name} did not freeze within {timeout_s:g} s "
                f"(still {state}); thawed again"
            )
        polls += 1
        try:
            await asyncio.sleep(poll)
            if polls % KICK_EVERY == 0:
                _write(state_file, "THAWED")
                await asyncio.sleep(KICK_THAWED_S)
        except asyncio.CancelledError:
            # the caller gave the pause up: it did not happen, so the group runs again
            # (its record still says running)
            _write(state_file, "THAWED")
            raise
        _write(state_file, "FROZEN")
        poll = min(poll * 2, _LAST_POLL_S)


# cgroupfs files are answered by the kernel at once: no thread for them
def _read(state_file: Path) -> str:
    return state_file.read_text().strip()


def _write(state_file: Path, state: str) -> None:
    state_file.write_text(state)
