"""The wasm worker process: runs every wasm guest of a node, inside its jail.

Started by ``node.fncall.wasm.worker.WorkerProcess`` through nsjail (``node.fncall.wasm.jail``)
as an unprivileged user with an empty environment. Before it reads anything it forbids
itself ``execve`` (``seccomp.install_no_exec``). It then serves the node over its stdin
and stdout with the frames of ``node.fncall.wasm.protocol`` (stderr carries its log lines):
an ``init`` frame with the configuration, compiled interpreters, ``start``, then calls
(``run``) and compiled raw modules (``load``), handled concurrently, and ``status`` frames
of its own whenever its pools change. It exits when its stdin closes or on ``close``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from pathlib import Path
from typing import Any

from node.fncall.wasm.config import MIB, WasmConfig
from node.fncall.wasm.protocol import Bounds, Frame, FrameError, FrameWriter, encode, read_frame

log = logging.getLogger(__name__)


def node_bounds(config: WasmConfig) -> Bounds:
    """What the worker accepts from the node: a spec with its files, a compiled module."""
    return Bounds(
        max_json=2 * config.max_input_bytes + 16 * MIB, max_blob=config.max_compiled_bytes
    )


def worker_bounds(config: WasmConfig) -> Bounds:
    """What the node accepts from the worker: a result (output, fetched files)."""
    return Bounds(max_json=4 * config.max_fetch_bytes + 256 * MIB, max_blob=0)


class _Server:
    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self._frames = FrameWriter(writer)  #: the replies of one turn of the loop together
        self._executor: Any = None
        self._config: WasmConfig | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._last_status: dict[str, Any] | None = None

    async def send(self, msg: dict[str, Any]) -> None:
        data = encode(msg)
        if self._config is not None and len(data) > worker_bounds(self._config).max_json:
            msg = {"op": msg["op"], "id": msg.get("id")}
            msg["result"] = {"error": "the result is too large to report"}
            data = encode(msg)
        self._frames.write(data)
        await self._writer.drain()

    def flush(self) -> None:
        self._frames.flush()

    async def reply(self, frame: Frame, **fields: Any) -> None:
        await self.send({"op": "reply", "id": frame.msg.get("id"), **fields})

    async def serve(self, reader: asyncio.StreamReader) -> None:
        from node.fncall.wasm.executor import WasmExecutor
        from node.fncall.wasm.jail import RUN_DIR

        init = await read_frame(reader, Bounds(max_json=16 * MIB, max_blob=0))
        if init is None or init.msg["op"] != "init":
            raise FrameError("the first frame must be init")
        self._config = config = WasmConfig.model_validate(init.msg["config"])
        self._executor = WasmExecutor(config, Path(RUN_DIR) / "instances")
        await self.reply(init, pid=os.getpid())
        status = asyncio.create_task(self._report(config.status_interval_s))
        try:
            while True:
                frame = await read_frame(reader, node_bounds(config))
                if frame is None:
                    return
                if frame.msg["op"] == "close":
                    await self._close()
                    await self.reply(frame)
                    return
                task = asyncio.create_task(self._handle(frame))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        finally:
            status.cancel()
            await self._close()

    async def _close(self) -> None:
        """Close the executor (running calls end KILLED), let their replies go out, then
        cancel whatever is left."""
        if self._executor is not None:
            await self._executor.close()
        tasks = list(self._tasks)
        if tasks:
            timeout = self._config.close_timeout_s if self._config is not None else 1.0
            _done, pending = await asyncio.wait(tasks, timeout=timeout)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    async def _handle(self, frame: Frame) -> None:
        from wire.execution import RunSpec

        executor = self._executor
        msg = frame.msg
        op = msg["op"]
        try:
            if op == "interpreter":
                await asyncio.to_thread(
                    executor.load_interpreter, msg["language"], msg["sha256"], frame.blob
                )
                await self.reply(frame)
            elif op == "start":
                await executor.start()
                await self.reply(frame, status=self._status())
            elif op == "load":
                error = await asyncio.to_thread(executor.load_module, msg["sha256"], frame.blob)
                await self.reply(frame, error=error)
            elif op == "run":
                spec = RunSpec.model_validate(msg["spec"])
                result = await executor.run(spec, invocation_id=msg["inv"], module=msg["module"])
                if result is None:
                    await self.reply(frame, need=msg["module"])
                else:
                    result_json = result.model_dump(mode="json")
                    status = self._changed_status()
                    if status is None:
                        await self.reply(frame, result=result_json)
                    else:
                        await self.reply(frame, result=result_json, status=status)
            else:
                await self.reply(frame, failure=f"unknown op {op!r}")
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("inv=%s wasm worker: %s failed", msg.get("inv"), op)
            await self.reply(frame, failure=f"{type(exc).__name__}: {exc}")

    def _status(self) -> dict[str, Any]:
        status: dict[str, Any] = self._executor.status()
        return status

    def _changed_status(self) -> dict[str, Any] | None:
        """The status if the node has not seen it: idle capacity accrued, or gauges (the
        stuck count among them) other than those last sent."""
        status = self._status()
        gauges = {k: v for k, v in status.items() if k != "idle"}
        if not status["idle"] and gauges == self._last_status:
            return None
        self._last_status = gauges
        return status

    async def _report(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            status = self._changed_status()
            if status is not None:
                await self.send({"op": "status", **status})


async def _main() -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 16)
    await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(0, "rb", buffering=0)
    )
    transport, protocol = await loop.connect_write_pipe(
        asyncio.streams.FlowControlMixin, os.fdopen(1, "wb", buffering=0)
    )
    writer = asyncio.StreamWriter(transport, protocol, None, loop)
    server = _Server(writer)
    try:
        await server.serve(reader)
    finally:
        server.flush()
        with contextlib.suppress(Exception):
            await writer.drain()


def main() -> None:
    from node.fncall.wasm.seccomp import install_no_exec

    install_no_exec()
    sys.stdout = sys.stderr  # fd 1 carries frames only
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s"
    )
    asyncio.run(_main())
