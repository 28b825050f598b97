"""How the code interpreter ends a context's worker, against a node whose process table
drops a killed process a few reads later (as a real node does once the process's pipes
are drained)."""

from __future__ import annotations

import signal
from typing import Any, cast

import pytest

from app.api.e2b import interpreter
from app.sandboxes.nodes import NodeClient
from wire.processes import ProcessInfo


class _LingeringNode:
    """A sandbox's process table in which a killed process stays listed for ``linger``
    more reads."""

    def __init__(self, *, linger: int) -> None:
        self.table = {
            7: ProcessInfo(pid=7, tag=interpreter.TAG + "ctx", cmd=["python3"], started_at=0.0)
        }
        self.linger = linger
        self.signals: list[tuple[int, int]] = []
        self.reads_after_kill = 0

    async def signal_process(self, sandbox_id: str, pid: int, signum: int) -> None:
        self.signals.append((pid, signum))

    async def processes(self, sandbox_id: str) -> list[ProcessInfo]:
        if self.signals:
            self.reads_after_kill += 1
            if self.reads_after_kill > self.linger:
                self.table.clear()
        return list(self.table.values())


def _node(fake: _LingeringNode) -> NodeClient:
    return cast(NodeClient, cast(Any, fake))


async def test_a_removed_context_has_left_the_table_when_the_remove_returns() -> None:
    node = _LingeringNode(linger=3)
    await interpreter.end_worker(_node(node), "sbx", "ctx", 7)
    assert node.signals == [(7, signal.SIGKILL)]
    assert "ctx" not in await interpreter._workers(_node(node), "sbx")
    assert node.reads_after_kill >= 4


async def test_a_worker_that_outlives_its_kill_does_not_hold_the_caller_forever(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(interpreter, "END_WAIT_S", 0.1)
    node = _LingeringNode(linger=10**6)
    await interpreter.end_worker(_node(node), "sbx", "ctx", 7)
    assert node.signals == [(7, signal.SIGKILL)]
    assert "ctx" in await interpreter._workers(_node(node), "sbx")
