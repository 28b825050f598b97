"""Warm interpreter instances as pool workers: how the shared pool (``node.pools``)
starts and stops them.

One pool key per interpreter (``wasm/<language>``). ``start`` builds an instance, runs
its interpreter's start-up on the instance's own thread (wasm runs with the GIL
released) and returns once the bootstrap reports ready, waiting for that on the event
loop. Instances are one-shot: each serves one call and is then discarded, so the pool
never hands one out twice. An instance that ends before it is ready is a failed start
(the pool backs off), so a broken interpreter cannot make the pool spin.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping

from node.fncall.wasm.instance import Instance
from node.pools.worker import WorkerFactory

MIB = 1024 * 1024


class WarmupError(RuntimeError):
    """An instance ended before it was ready."""


class WasmWorkers(WorkerFactory[Instance]):
    one_shot = True

    def __init__(self, makers: Mapping[str, tuple[str, Callable[[], Instance]]]) -> None:
        """``makers``: pool key -> (language, a function building an unstarted warm
        instance of it)."""
        self._makers = dict(makers)

    async def start(self, key: str) -> Instance:
        language, make = self._makers[key]
        inst = make()
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[bool] = loop.create_future()

        def resolve(value: bool) -> None:
            if not ready.done():
                ready.set_result(value)

        def settle(value: bool) -> None:  # on the instance's thread
            with contextlib.suppress(RuntimeError):  # the loop is gone
                loop.call_soon_threadsafe(resolve, value)

        inst.on_ready(lambda _inst: settle(True))
        inst.on_done(lambda _inst: settle(False))
        try:
            inst.start()
            ok = await ready
        except BaseException:  # cancelled (the pool's start timeout, or close)
            await self.stop(inst)
            raise
        if not ok or inst.done:
            await self.stop(inst)
            raise WarmupError(f"a {language} instance failed to start: {_tail(inst)}")
        return inst

    async def stop(self, worker: Instance) -> None:
        """End the guest (stdin closed, sleeps woken) and let its thread release the
        Store and host dir once it has ended. Non-blocking, idempotent."""
        worker.abort()
        worker.dispose()

    def alive(self, worker: Instance) -> bool:
        return not worker.done

    def memory_mb(self, worker: Instance) -> float:
        return worker.clock.memory_bytes / MIB


def _tail(inst: Instance) -> str:
    outcome = inst.outcome
    if outcome is None:
        return "it ended before it was ready"
    return outcome.error or outcome.trap or f"exit code {outcome.exit_code}"
