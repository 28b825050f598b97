"""The worker's status: sent with a reply or on its own only when the node has not seen it."""

from __future__ import annotations

from typing import Any, cast

from node.fncall.wasm.worker_main import _Server


class Statuses:
    """An executor whose ``status()`` returns the given statuses in turn."""

    def __init__(self, *statuses: dict[str, Any]) -> None:
        self._statuses = list(statuses)

    def status(self) -> dict[str, Any]:
        return self._statuses.pop(0)


def _status(stuck: int = 0, idle: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"warm": 0, "starting": 0, "stuck": stuck, "inventory": {}, "idle": idle or {}}


def test_a_status_goes_out_only_when_the_node_has_not_seen_it() -> None:
    server = _Server(cast(Any, object()))
    server._executor = Statuses(
        _status(),  # the first: always
        _status(),  # unchanged: not sent
        _status(stuck=1),  # a stuck guest: sent
        _status(stuck=1),
        _status(stuck=1, idle={"k": [1.0, 2.0, 1, 0]}),  # idle capacity accrued: sent
        _status(stuck=1),
    )
    sent = [server._changed_status() is not None for _ in range(6)]
    assert sent == [True, False, True, False, True, False]
