"""QuickJS-on-WASI through the warm pool."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from node.fncall.wasm import WasmBackend
from wire.execution import StageStatus

RunFn = Callable[..., Any]

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.usefixtures("need_javascript")]

JS = "wasm-javascript"


async def test_hello(runtime: WasmBackend, run: RunFn) -> None:
    result = await run(runtime, "console.log('hello', 6 * 7)", language=JS)
    assert result.run is not None and result.run.ok, result.run
    assert result.run.stdout == "hello 42\n"


async def test_stdin_and_unicode(runtime: WasmBackend, run: RunFn) -> None:
    code = "const s = std.in.readAsString(); console.log(s.trim().toUpperCase() + ' ✓')"
    result = await run(runtime, code, language=JS, stdin="héllo\n")
    assert result.run is not None and result.run.ok, result.run
    assert result.run.stdout == "HÉLLO ✓\n"


async def test_promises_and_timers_run(runtime: WasmBackend, run: RunFn) -> None:
    code = (
        "Promise.resolve(1).then(v => console.log('promise', v));\n"
        "(async () => { await null; console.log('async'); })();\n"
        "os.setTimeout(() => console.log('timer'), 20);\n"
        "console.log('sync');"
    )
    result = await run(runtime, code, language=JS)
    assert result.run is not None and result.run.ok, result.run
    assert result.run.stdout.splitlines() == ["sync", "promise 1", "async", "timer"]


async def test_uncaught_error_exits_1(runtime: WasmBackend, run: RunFn) -> None:
    code = "function boom() { throw new TypeError('nope'); }\nboom();"
    result = await run(runtime, code, language=JS)
    assert result.run is not None
    assert result.run.status is StageStatus.FINISHED and result.run.exit_code == 1
    assert "TypeError: nope" in result.run.stderr
    assert "boom" in result.run.stderr


async def test_exit_code(runtime: WasmBackend, run: RunFn) -> None:
    result = await run(runtime, "console.log('bye'); std.exit(3);", language=JS)
    assert result.run is not None and result.run.exit_code == 3
    assert result.run.stdout == "bye\n"


async def test_calls_do_not_share_state(runtime: WasmBackend, run: RunFn) -> None:
    first = await run(runtime, "globalThis.secret = 42; console.log('set')", language=JS)
    assert first.run is not None and first.run.ok
    second = await run(runtime, "console.log(typeof globalThis.secret)", language=JS)
    assert second.run is not None and second.run.stdout == "undefined\n"


async def test_infinite_loop_hits_time_limit(runtime: WasmBackend, run: RunFn) -> None:
    result = await run(runtime, "for (;;) {}", language=JS, run_timeout_s=1.0)
    assert result.run is not None
    assert result.run.status is StageStatus.TIME_LIMIT, result.run
    assert 0.9 * 1000 <= result.run.wall_ms <= 3 * 1000


async def test_memory_bomb_hits_memory_limit(runtime: WasmBackend, run: RunFn) -> None:
    code = "const a = []; for (;;) a.push(new Array(100000).fill(1));"
    result = await run(runtime, code, language=JS, memory_mb=48)
    assert result.run is not None
    assert result.run.status is StageStatus.MEMORY_LIMIT, result.run
    assert result.run.peak_memory_kb is not None and result.run.peak_memory_kb <= 48 * 1024
