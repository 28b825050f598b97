"""``WorkerProcess``: the node's handle on one wasm worker (``worker_main`` in its jail).

It starts the jail with an empty environment, sends the configuration and the compiled
interpreters, and then carries requests: each gets an id, and its reply resolves the
caller's future. One task reads the worker's frames (bounded: ``worker_bounds``), one
relays its stderr to the log. When the worker exits, breaks the protocol or is killed,
every waiting request fails with ``WorkerDied``: the runtime reports those calls as
platform errors and starts another worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
import time
from collections.abc import Callable
from typing import Any

from node.fncall.nsjail.cgroups import CgroupSetup
from node.fncall.wasm import jail
from node.fncall.wasm.config import MIB, WasmConfig
from node.fncall.wasm.protocol import FrameError, FrameWriter, encode, read_frame
from node.fncall.wasm.worker_main import worker_bounds
from node.timeouts import fail_after

log = logging.getLogger(__name__)

MAX_LOG_LINE = 2000


class WorkerDied(RuntimeError):
    """The worker ended (or was ended) before it answered."""


class WorkerProcess:
    def __init__(
        self,
        config: WasmConfig,
        cgroups: CgroupSetup,
        *,
        on_status: Callable[[dict[str, Any]], None],
    ) -> None:
        self._config = config
        self._cgroups = cgroups
        self._on_status = on_status
        self._proc: asyncio.subprocess.Process | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._frames: FrameWriter | None = None  #: the requests of one turn of the loop together
        self.died: asyncio.Future[str] | None = None
        self.worker_pid: int | None = None  #: the worker's pid inside its jail

    @property
    def pid(self) -> int | None:
        """The host pid of nsjail, the worker's parent."""
        return self._proc.pid if self._proc is not None else None

    @property
    def alive(self) -> bool:
        return self.died is not None and not self.died.done()

    def guest_host_pid(self) -> int | None:
        """The host pid of the worker process itself (nsjail's only child)."""
        if self._proc is None:
            return None
        try:
            with open(f"/proc/{self._proc.pid}/task/{self._proc.pid}/children") as f:
                children = f.read().split()
        except OSError:
            return None
        return int(children[0]) if children else None

    async def start(self, interpreters: dict[str, tuple[str, bytes]]) -> dict[str, Any]:
        """Start the jail, load ``interpreters`` (language -> (sha256, .cwasm)), warm the
        pools; returns the first status. Raises ``WorkerDied`` if it fails."""
        cfg = self._config
        limits = jail.JailLimits(
            memory_bytes=cfg.worker_memory_mb * MIB,
            pids=cfg.worker_pids,
            cpu_ms_per_sec=cfg.resolved_worker_cpu_ms_per_sec,
            file_bytes_mb=max(1, cfg.max_input_bytes // MIB + 1),
            run_mb=cfg.run_tmpfs_mb,
            nice=cfg.worker_nice,
        )
        argv = jail.argv(cfg, self._cgroups, entry="node.fncall.wasm.worker_main", limits=limits)
        await self._launch(argv, env={})
        hello = await self.request({"op": "init", "config": cfg.model_dump(mode="json")})
        self.worker_pid = hello.get("pid")
        for language, (sha256, compiled) in interpreters.items():
            await self.request(
                {"op": "interpreter", "language": language, "sha256": sha256}, compiled
            )
        started = await self.request({"op": "start"})
        status: dict[str, Any] = started.get("status") or {}
        return status

    async def _launch(self, argv: list[str], env: dict[str, str]) -> None:
        """Start ``argv`` (the jail) and the tasks reading its stdout and stderr."""
        self._proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
        assert self._proc.stdin is not None
        self._frames = FrameWriter(self._proc.stdin)
        self.died = asyncio.get_running_loop().create_future()
        self._tasks = [
            asyncio.create_task(self._read(), name="wasm-worker-reader"),
            asyncio.create_task(self._relay_stderr(), name="wasm-worker-stderr"),
        ]

    async def request(
        self, msg: dict[str, Any], blob: bytes = b"", *, timeout: float | None = None
    ) -> dict[str, Any]:
        """Send ``msg`` and wait for its reply; ``WorkerDied`` if the worker ends first,
        ``TimeoutError`` after ``timeout``."""
        proc = self._proc
        if proc is None or proc.stdin is None or self._frames is None or not self.alive:
            raise WorkerDied("the wasm worker is not running")
        ident = next(self._ids)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[dict[str, Any]] = loop.create_future()
        self._pending[ident] = future
        timer = None if timeout is None else fail_after(timeout, future)
        try:
            self._frames.write(encode({**msg, "id": ident}, blob))
            await proc.stdin.drain()
            return await future
        except (ConnectionError, RuntimeError) as exc:
            if isinstance(exc, WorkerDied):
                raise
            raise WorkerDied(f"the wasm worker's pipe broke: {exc}") from exc
        finally:
            if timer is not None:
                timer.cancel()
            self._pending.pop(ident, None)

    async def _read(self) -> None:
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        reason = "the wasm worker exited"
        try:
            while True:
                frame = await read_frame(proc.stdout, worker_bounds(self._config))
                if frame is None:
                    break
                msg = frame.msg
                if msg["op"] == "status":
                    self._on_status(msg)
                elif msg["op"] == "reply":
                    future = self._pending.get(msg.get("id", -1))
                    if future is not None and not future.done():
                        future.set_result(msg)
                else:
                    raise FrameError(f"unexpected op {msg['op']!r}")
        except FrameError as exc:
            reason = f"the wasm worker broke the protocol: {exc}"
            log.error("%s; killing it", reason)
            self.kill()
        except Exception as exc:  # a closed pipe
            reason = f"the wasm worker's pipe failed: {exc!r}"
        status = await proc.wait()
        reason = f"{reason} (status {status})"
        if self.died is not None and not self.died.done():
            self.died.set_result(reason)
        for future in list(self._pending.values()):
            if not future.done():
                future.set_exception(WorkerDied(reason))

    async def _relay_stderr(self) -> None:
        proc = self._proc
        assert proc is not None and proc.stderr is not None
        while True:
            try:
                line = await proc.stderr.readuntil(b"\n")
            except asyncio.IncompleteReadError as exc:
                line = exc.partial
                if not line:
                    return
            except asyncio.LimitOverrunError as exc:
                line = await proc.stderr.readexactly(exc.consumed)
            text = line.decode("utf-8", "replace").rstrip()
            if text and "no version information available" not in text:
                log.info("wasm worker %s: %s", proc.pid, text[:MAX_LOG_LINE])

    async def drain(self, timeout: float) -> bool:
        """Wait until no request is in flight (True), at most ``timeout``."""
        deadline = time.monotonic() + timeout
        while self._pending and self.alive:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.05)
        return True

    def kill(self) -> None:
        """End the jail at once (nsjail and the worker). Idempotent."""
        proc = self._proc
        if proc is not None and proc.returncode is None:
            guest = self.guest_host_pid()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            if guest is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(guest, signal.SIGKILL)

    async def close(self, timeout: float) -> None:
        """Ask the worker to close (its running calls end KILLED and are answered), wait
        for it, kill it if it does not exit in ``timeout``."""
        proc = self._proc
        if proc is None:
            return
        if self.alive:
            with contextlib.suppress(WorkerDied, TimeoutError):
                await self.request({"op": "close"}, timeout=timeout)
        if proc.stdin is not None:
            with contextlib.suppress(Exception):
                proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), timeout)
        except TimeoutError:
            log.error("wasm worker %s did not exit; killing it", proc.pid)
            self.kill()
            await proc.wait()
        await asyncio.gather(*self._tasks, return_exceptions=True)
