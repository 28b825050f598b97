"""Compiling modules in compile jails: a fresh, limited process per module, never the node.

``Compiler.compile`` starts a jail running ``node.fncall.wasm.compile_main``, hands it the
module's bytes and reads the ``.cwasm`` back. The kernel bounds it: RLIMIT_CPU (the compile
deadline in CPU seconds: SIGKILL when spent), a cgroup memory and pids limit, and a
wall-clock deadline after which the host kills it. Its CPU time is the kernel's account
of the jail (``wait4`` rusage of nsjail and every process it waited for), so the tenant is
charged what the compile really cost. Compiles of different modules run side by side;
nothing is serialised behind a lock (a module compiled by two calls at once is compiled
once: ``node.fncall.wasm.backend`` merges them).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import selectors
import signal
import subprocess
import time
from dataclasses import dataclass

from node.fncall.nsjail.cgroups import CgroupSetup
from node.fncall.wasm import jail
from node.fncall.wasm.config import MIB, WasmConfig
from node.fncall.wasm.protocol import HEADER, encode
from wire.execution import StageResult, StageStatus

log = logging.getLogger(__name__)

STDERR_TAIL = 4096
#: an exit status of nsjail for a jailed process killed by SIGKILL / SIGXCPU
_KILLED = {128 + signal.SIGKILL, 128 + signal.SIGXCPU, -signal.SIGKILL, -signal.SIGXCPU}


@dataclass
class Compiled:
    """What a compile produced: the ``.cwasm`` (None if it failed), the compile stage
    (its time, CPU and verdict) and, for bytes that are not a module, why."""

    cwasm: bytes | None
    stage: StageResult
    invalid: str | None = None


@dataclass
class _Exit:
    status: int
    stdout: bytes
    stderr: bytes
    cpu_s: float
    wall_s: float
    timed_out: bool
    overflow: bool


class Compiler:
    def __init__(self, config: WasmConfig, cgroups: CgroupSetup) -> None:
        self._config = config
        self._cgroups = cgroups

    async def compile(
        self, data: bytes, *, cpu_s: float, wall_s: float, memory_mb: int, parallel: bool
    ) -> Compiled:
        """Compile ``data`` within ``cpu_s`` of CPU, ``wall_s`` of wall time and
        ``memory_mb``; never raises for the module's faults."""
        limits = jail.JailLimits(
            memory_bytes=memory_mb * MIB,
            pids=64,
            cpu_seconds=max(1, math.ceil(cpu_s)),
            nofile=256,
        )
        argv = jail.argv(
            self._config, self._cgroups, entry="node.fncall.wasm.compile_main", limits=limits
        )
        header = {"op": "compile", "config": self._config.model_dump(mode="json")}
        request = encode({**header, "parallel": parallel}, data)
        done = await asyncio.to_thread(
            _run, argv, request, wall_s=wall_s, max_out=self._config.max_compiled_bytes + 65536
        )
        return self._judge(done, cpu_s=cpu_s, wall_s=wall_s, memory_mb=memory_mb)

    def _judge(self, done: _Exit, *, cpu_s: float, wall_s: float, memory_mb: int) -> Compiled:
        stage = StageResult(
            status=StageStatus.FINISHED,
            exit_code=0,
            wall_ms=done.wall_s * 1000,
            cpu_ms=done.cpu_s * 1000,
        )
        if done.status == 0 and not done.overflow:
            reply = _parse(done.stdout)
            if reply is not None:
                msg, blob = reply
                if isinstance(msg.get("error"), str):
                    stage.exit_code = 1
                    stage.message = f"not a valid WebAssembly module: {msg['error']}"
                    return Compiled(None, stage, invalid=stage.message)
                return Compiled(blob, stage)
        if done.timed_out or done.cpu_s >= cpu_s * 0.95:
            stage.status = StageStatus.TIME_LIMIT
            limit = f"{cpu_s:g}s of CPU" if not done.timed_out else f"{wall_s:g}s"
            stage.message = f"compiling the module exceeded its limit of {limit}"
            stage.judge_contention()
        elif done.overflow:
            stage.status = StageStatus.OUTPUT_LIMIT
            stage.message = "the compiled module is over the size limit"
        elif done.status in _KILLED:
            stage.status = StageStatus.MEMORY_LIMIT
            stage.message = f"compiling the module exceeded its memory limit of {memory_mb} MB"
        else:
            stage.status = StageStatus.ERROR
            tail = done.stderr.decode("utf-8", "replace").strip().splitlines()[-3:]
            stage.message = f"the compile jail failed (status {done.status}): {' | '.join(tail)}"
            log.error("wasm compile jail failed: status %s: %s", done.status, tail)
        stage.exit_code = None
        return Compiled(None, stage)


def _parse(out: bytes) -> tuple[dict[str, object], bytes] | None:
    if len(out) < HEADER.size:
        return None
    json_len, blob_len = HEADER.unpack_from(out)
    if len(out) != HEADER.size + json_len + blob_len:
        return None
    try:
        msg = json.loads(out[HEADER.size : HEADER.size + json_len])
    except ValueError:
        return None
    if not isinstance(msg, dict):
        return None
    return msg, out[HEADER.size + json_len :]


def _stop(pid: int) -> None:
    """End a jail: SIGTERM makes nsjail kill and reap the jailed process (so its CPU time
    is still counted), SIGKILL if nsjail does not exit within a second."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        try:
            info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is not None:
            return
        time.sleep(0.01)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def _run(argv: list[str], stdin: bytes, *, wall_s: float, max_out: int) -> _Exit:
    """Run ``argv`` feeding ``stdin``, keep at most ``max_out`` bytes of stdout, kill it at
    ``wall_s``; reap it with ``wait4`` for the kernel's CPU account. Blocking."""
    started = time.monotonic()
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={},
        close_fds=True,
        start_new_session=True,
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    out, err = bytearray(), bytearray()
    timed_out = overflow = False
    pending = memoryview(stdin)
    with selectors.DefaultSelector() as sel:
        os.set_blocking(proc.stdin.fileno(), False)
        sel.register(proc.stdin, selectors.EVENT_WRITE)
        sel.register(proc.stdout, selectors.EVENT_READ)
        sel.register(proc.stderr, selectors.EVENT_READ)
        while len(sel.get_map()):
            left = started + wall_s - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            for key, _ in sel.select(min(left, 1.0)):
                if key.fileobj is proc.stdin:
                    try:
                        pending = pending[os.write(proc.stdin.fileno(), pending[: 1 << 16]) :]
                    except (BrokenPipeError, BlockingIOError) as exc:
                        if isinstance(exc, BlockingIOError):
                            continue
                        pending = pending[len(pending) :]
                    if not pending:
                        sel.unregister(proc.stdin)
                        proc.stdin.close()
                    continue
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                if key.fileobj is proc.stdout:
                    out += chunk
                    if len(out) > max_out:
                        overflow = True
                        break
                else:
                    err = (err + chunk)[-STDERR_TAIL:]
            if overflow:
                break
    if timed_out or overflow:
        _stop(proc.pid)
    _pid, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        with contextlib.suppress(OSError):
            stream.close()
    return _Exit(
        status=proc.returncode,
        stdout=bytes(out),
        stderr=bytes(err),
        cpu_s=usage.ru_utime + usage.ru_stime,
        wall_s=time.monotonic() - started,
        timed_out=timed_out,
        overflow=overflow,
    )
