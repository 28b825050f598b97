"""Start, cache, stats, close and registration of the wasm runtime."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from node.fncall import registry
from node.fncall.wasm import WasmBackend, WasmConfig, pycomponent
from node.fncall.wasm.backend import InterpreterInfo
from node.fncall.wasm.modules import InterpreterError
from node.settings import NodeSettings
from tests.node.fncall.wasm.conftest import interpreters_dir
from wire.execution import RunSpec, StageStatus
from wire.messages import pool_key

RunFn = Callable[..., Any]

pytestmark = pytest.mark.asyncio(loop_scope="function")


def built_sha256() -> str:
    built = pycomponent.current(interpreters_dir())
    assert built is not None
    return built.sha256


JS = {"language": "wasm-javascript"}


def wasm_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("wasm")]


async def test_languages_are_prefixed(new_runtime: Callable[..., WasmBackend]) -> None:
    rt = new_runtime()
    names = {lang.name for lang in rt.languages()}
    assert {"wasm-python", "wasm"} <= names
    assert all(lang.runtime == "wasm" for lang in rt.languages())
    assert not names & {"python", "javascript"}
    await rt.close()  # never started: close is still safe


async def test_second_start_loads_from_the_cache(
    new_runtime: Callable[..., WasmBackend],
    wasm_data_dir: Path,
    compiled: dict[str, InterpreterInfo],
) -> None:
    compile_ms = compiled["wasm-python"].load_ms
    assert not compiled["wasm-python"].cached  # the session's cache started empty
    rt = new_runtime(languages=["wasm-python"], warm_per_language=0)
    started = time.perf_counter()
    await rt.start()
    start_ms = (time.perf_counter() - started) * 1000
    fingerprint = rt.engine_fingerprint
    loaded = rt.interpreters["wasm-python"]
    await rt.close()
    assert fingerprint is not None
    cache_file = (
        wasm_data_dir / "wasm" / "cache" / fingerprint / "interpreters" / f"{built_sha256()}.cwasm"
    )
    assert cache_file.is_file()
    assert loaded.cached
    assert start_ms < compile_ms / 3  # relative, not absolute: mapping a .cwasm vs compiling


async def test_cache_entry_of_another_engine_config_is_separate(
    new_runtime: Callable[..., WasmBackend],
) -> None:
    plain = new_runtime(languages=[], warm_per_language=0)
    fueled = new_runtime(languages=[], warm_per_language=0, fuel_per_call=10**9)
    await plain.start()
    await fueled.start()
    try:
        assert plain.engine_fingerprint and fueled.engine_fingerprint
        assert plain.engine_fingerprint != fueled.engine_fingerprint
    finally:
        await plain.close()
        await fueled.close()


async def test_fuel_budget_stops_a_spin(
    new_runtime: Callable[..., WasmBackend], run_module: RunFn
) -> None:
    from wasmtime import wat2wasm

    rt = new_runtime(languages=["wasm"], fuel_per_call=5_000_000)
    await rt.start()
    try:
        spin = bytes(wat2wasm('(module (func (export "_start") (loop (br 0))))'))
        result = await run_module(rt, spin, run_timeout_s=10.0)
        assert result.run is not None and result.run.status is StageStatus.TIME_LIMIT
        assert result.run.message and "fuel" in result.run.message
        assert result.run.wall_ms < 5000
    finally:
        await rt.close()


async def test_stats_close_and_no_threads_left(
    new_runtime: Callable[..., WasmBackend], run: RunFn, need_javascript: None
) -> None:
    before = set(wasm_threads())
    rt = new_runtime(languages=["wasm-javascript", "wasm"], warm_per_language=2)
    await rt.start()
    assert rt.stats() == {"warm": 2, "busy": 0, "starting": 0}
    assert set(wasm_threads()) <= before  # every guest thread is in the worker process
    # a call that would run for a minute is busy while the runtime closes
    busy = asyncio.create_task(run(rt, "while (true) {}", run_timeout_s=60.0, **JS))
    for _ in range(500):
        if rt.stats()["busy"]:
            break
        await asyncio.sleep(0.01)
    assert rt.stats()["busy"] == 1
    started = time.perf_counter()
    await rt.close()
    assert time.perf_counter() - started < 10
    result = await busy
    assert result.run is not None and result.run.status is StageStatus.KILLED
    assert set(wasm_threads()) <= before, wasm_threads()
    await rt.close()  # idempotent
    after = await run(rt, "print(1)", **JS)
    assert after.error and "not running" in after.error


async def test_unknown_language_is_a_platform_error(
    new_runtime: Callable[..., WasmBackend],
) -> None:
    rt = new_runtime(languages=["wasm"], warm_per_language=0)
    await rt.start()
    try:
        result = await rt.run(
            RunSpec(language="cobol", code="x"), tenant_id="t", invocation_id="inv-1"
        )
        assert result.error and "cobol" in result.error
    finally:
        await rt.close()


async def test_cold_start_when_the_pool_is_empty(
    new_runtime: Callable[..., WasmBackend], run: RunFn, need_javascript: None
) -> None:
    rt = new_runtime(languages=["wasm-javascript"], warm_per_language=0)
    await rt.start()
    try:
        assert rt.stats()["warm"] == 0
        result = await run(rt, "print('cold')", **JS)
        assert result.run is not None and result.run.stdout == "cold\n"
        cold = 0  # the worker reports the cold start it paid with its next status
        for _ in range(200):
            cold += sum(cap.cold_starts for cap in rt.idle_capacity().values())
            if cold:
                break
            await asyncio.sleep(0.05)
        assert cold >= 1
    finally:
        await rt.close()


async def test_corrupt_interpreter_fails_start_when_strict(
    new_runtime: Callable[..., WasmBackend], tmp_path: Path
) -> None:
    from node.fncall.wasm.languages import QUICKJS_FILE
    from node.fncall.wasm.modules import InterpreterError

    (tmp_path / QUICKJS_FILE).write_bytes(b"\0asm\x01\0\0\0tampered")
    strict = new_runtime(languages=["wasm-javascript"], interpreters_dir=tmp_path)
    with pytest.raises(InterpreterError, match="SHA-256"):
        await strict.start()
    await strict.close()
    lenient = new_runtime(
        languages=["wasm-javascript", "wasm"], interpreters_dir=tmp_path, strict_interpreters=False
    )
    await lenient.start()
    try:
        assert [lang.name for lang in lenient.languages()] == ["wasm"]
    finally:
        await lenient.close()


async def test_registered_and_built_from_settings(wasm_data_dir: Path) -> None:
    assert "wasm" in registry.names()
    settings = NodeSettings(dev_mode=True, data_dir=wasm_data_dir, node_slots=3)
    rt = registry.create("wasm", settings)
    assert isinstance(rt, WasmBackend)
    assert rt.config.data_dir == wasm_data_dir
    assert rt.config.warm_per_language == 3
    assert not rt.config.strict_interpreters
    assert (
        WasmConfig.from_settings(NodeSettings(dev_mode=True, node_slots=64)).warm_per_language == 4
    )
    await rt.close()


async def test_the_python_component_is_built_when_missing_and_checked(
    new_runtime: Callable[..., WasmBackend], run: RunFn, tmp_path: Path
) -> None:
    """Without a component in its interpreters dir, the runtime builds one (and its
    manifest) at start; a component that no longer matches its manifest is refused."""
    rt = new_runtime(languages=["wasm-python"], interpreters_dir=tmp_path)
    await rt.start()
    try:
        result = await run(rt, "print('built')")
        assert result.run is not None and result.run.stdout == "built\n", result
    finally:
        await rt.close()
    built = pycomponent.current(tmp_path)
    assert built is not None and rt.interpreters["wasm-python"].sha256 == built.sha256
    data = bytearray(built.path.read_bytes())
    data[-1] ^= 0xFF  # tampered after the build
    built.path.write_bytes(bytes(data))
    tampered = new_runtime(languages=["wasm-python"], interpreters_dir=tmp_path)
    with pytest.raises(InterpreterError, match="SHA-256"):
        await tampered.start()
    await tampered.close()


async def test_inventory_and_idle_capacity_by_pool_key(
    new_runtime: Callable[..., WasmBackend], run: RunFn, need_javascript: None
) -> None:
    rt = new_runtime(languages=["wasm-javascript", "wasm-python", "wasm"], warm_per_language=2)
    await rt.start()
    key = pool_key("wasm", "wasm-javascript")
    try:
        assert rt.inventory() == {key: 2}  # raw modules and the Python component: no pool
        await asyncio.sleep(0.3)  # two instances idle meanwhile (the worker reports it)
        # each read hands over what was held since the last one; a start is reported with
        # the worker's next status, so the second warm start may come only with the next
        # event (seen on a slow machine: one of two after 5 s of reads): add reads up
        seconds = memory = 0.0
        starts = cold = 0
        for _ in range(500):
            capacity = rt.idle_capacity()
            assert set(capacity) <= {key}
            if key in capacity:
                seconds += capacity[key].instance_seconds
                memory += capacity[key].memory_mb_seconds
                starts += capacity[key].starts
                cold += capacity[key].cold_starts
            if starts >= 2 or (starts and seconds):
                break
            await asyncio.sleep(0.01)
        assert seconds > 0
        # QuickJS holds about 0.3 MiB of linear memory while it waits
        assert memory >= 0.1 * seconds
        assert 1 <= starts <= 2 and cold == 0, (starts, cold)  # warm, none for a caller
        result = await run(rt, "print(1)", **JS)
        assert result.run is not None and result.run.stdout == "1\n"
        for _ in range(500):  # the one-shot instance is replaced
            if rt.inventory() == {key: 2}:
                break
            await asyncio.sleep(0.01)
        assert rt.inventory() == {key: 2}
        for _ in range(100):  # the start is reported with the status after it
            capacity = rt.idle_capacity()
            if key in capacity and capacity[key].starts:
                break
            await asyncio.sleep(0.01)
        assert capacity[key].starts == 1
    finally:
        await rt.close()
    assert rt.inventory() == {} and rt.idle_capacity() == {}


async def test_idle_capacity_reported_by_a_worker_not_yet_current_is_kept() -> None:
    """A worker reports its warm starts with its next status, which may reach the node while
    the worker is still starting (not yet the runtime's current worker), and a worker being
    replaced still held its instances: their idle capacity is counted (a status hands over
    what accrued since the last one, so one dropped is lost). Their gauges are not the
    runtime's. (A CI run lost the two warm starts of
    ``test_inventory_and_idle_capacity_by_pool_key`` this way.)"""
    rt = WasmBackend(WasmConfig(languages=["wasm-javascript"]))
    key = pool_key("wasm", "wasm-javascript")
    starting, current = object(), object()
    rt._worker = current  # type: ignore[assignment]
    report = {"warm": 2, "starting": 0, "inventory": {key: 2}, "stuck": 0}
    rt._on_status({**report, "idle": {key: [0.5, 0.2, 2, 0]}}, starting)  # type: ignore[arg-type]
    assert rt.inventory() == {}  # the gauges of a worker that is not current
    rt._on_status({**report, "idle": {key: [0.25, 0.1, 0, 0]}}, current)  # type: ignore[arg-type]
    assert rt.inventory() == {key: 2}
    idle = rt.idle_capacity()[key]
    assert (idle.instance_seconds, idle.memory_mb_seconds) == (0.75, pytest.approx(0.3))
    assert (idle.starts, idle.cold_starts) == (2, 0)


async def test_a_cold_start_is_counted(
    new_runtime: Callable[..., WasmBackend], run: RunFn, need_javascript: None
) -> None:
    rt = new_runtime(languages=["wasm-javascript"], warm_per_language=0, max_warm_per_language=0)
    await rt.start()
    try:
        assert rt.inventory() == {}
        result = await run(rt, "print('cold')", **JS)
        assert result.run is not None and result.run.stdout == "cold\n"
        idle = rt.idle_capacity()[pool_key("wasm", "wasm-javascript")]
        assert (idle.starts, idle.cold_starts) == (1, 1)
        assert rt.stats()["warm"] == 0  # max 0: nothing is kept warm
    finally:
        await rt.close()
