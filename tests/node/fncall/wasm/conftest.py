"""Shared fixtures for the real-wasmtime tests (no mocks).

Compiling CPython to native code takes seconds (in a compile jail), so every runtime of
the session shares one data dir (and so one ``.cwasm`` cache) under a session temp dir:
the ``compiled`` fixture compiles once, every runtime after it loads the cache. Each test
module starts one ``WasmBackend`` for its tests (a module-scoped event loop).

QuickJS comes from ``scripts/setup-wasm.sh`` and C modules need clang: tests that need
them skip with the reason when they are missing, or fail when
CORRAL_TEST_REQUIRE_SERVICES=1 (``make test``).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from node.fncall.wasm import WasmBackend, WasmConfig
from node.fncall.wasm.backend import InterpreterInfo
from node.fncall.wasm.languages import QUICKJS_FILE
from tests.requirements import missing
from wire.execution import RunLimits, RunResult, RunSpec

REPO = Path(__file__).resolve().parents[4]
RunFn = Callable[..., Coroutine[Any, Any, RunResult]]


def _missing(reason: str) -> None:
    missing(f"{reason} (run scripts/setup-wasm.sh)")


def interpreters_dir() -> Path:
    return Path(os.environ.get("CORRAL_DATA_DIR", REPO / "var")) / "wasm" / "interpreters"


@pytest.fixture(scope="session")
def wasm_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The data dir (and .cwasm cache) shared by every runtime of the session."""
    return tmp_path_factory.mktemp("wasm-data")


def _make_runtime(shared_data_dir: Path, **overrides: Any) -> WasmBackend:
    settings: dict[str, Any] = {
        "data_dir": shared_data_dir,
        "interpreters_dir": interpreters_dir(),
        "warm_per_language": 2,
    }
    settings.update(overrides)
    return WasmBackend(WasmConfig.model_validate(settings))


@pytest.fixture(scope="session")
def compiled(wasm_data_dir: Path) -> dict[str, InterpreterInfo]:
    """Compile the interpreters into the session's cache once (before any runtime of the
    tests starts); returns how each was loaded (``load_ms`` of the compile)."""

    async def compile_all() -> dict[str, InterpreterInfo]:
        rt = _make_runtime(wasm_data_dir, warm_per_language=0)
        try:
            await rt.start()
            return rt.interpreters
        finally:
            await rt.close()

    return asyncio.run(compile_all())


@pytest.fixture(scope="session")
def new_runtime(
    wasm_data_dir: Path, compiled: dict[str, InterpreterInfo]
) -> Callable[..., WasmBackend]:
    """``new_runtime(**config_overrides)``: an unstarted runtime with test defaults."""

    def make(**overrides: Any) -> WasmBackend:
        return _make_runtime(wasm_data_dir, **overrides)

    return make


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def runtime(new_runtime: Callable[..., WasmBackend]) -> AsyncIterator[WasmBackend]:
    rt = new_runtime()
    await rt.start()
    try:
        yield rt
    finally:
        await rt.close()


@pytest.fixture(scope="session")
def need_javascript() -> None:
    if not (interpreters_dir() / QUICKJS_FILE).is_file():
        _missing(f"QuickJS is not installed in {interpreters_dir()}")


_counter = 0


async def run_code(
    rt: WasmBackend,
    code: str,
    *,
    language: str = "wasm-python",
    stdin: str = "",
    files: dict[str, bytes] | None = None,
    fetch: list[str] | None = None,
    **limits: Any,
) -> RunResult:
    global _counter
    _counter += 1
    base: dict[str, Any] = {"run_timeout_s": 5.0, "memory_mb": 128}
    base.update(limits)
    spec = RunSpec(
        language=language,
        code=code,
        stdin=stdin,
        files={k: base64.b64encode(v).decode() for k, v in (files or {}).items()},
        fetch_files=fetch or [],
        limits=RunLimits(**base),
    )
    return await rt.run(spec, tenant_id="tenant-a", invocation_id=f"wasm-test-{_counter}")


@pytest.fixture(scope="session")
def run() -> RunFn:
    """``await run(rt, code, language=..., stdin=..., files=..., fetch=..., **limits)``."""
    return run_code


@pytest.fixture(scope="session")
def run_module() -> Callable[..., Coroutine[Any, Any, RunResult]]:
    """``await run_module(rt, wasm_bytes, stdin=..., files=..., **limits)``."""

    async def go(
        rt: WasmBackend, module: bytes, *, files: dict[str, bytes] | None = None, **kw: Any
    ) -> RunResult:
        return await run_code(
            rt, "", language="wasm", files={"module.wasm": module, **(files or {})}, **kw
        )

    return go


@pytest.fixture(scope="session")
def compile_c(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], bytes]:
    """``compile_c(source) -> wasm bytes``, with ``clang --target=wasm32-wasi -O2``."""
    clang = shutil.which("clang")
    out_dir = tmp_path_factory.mktemp("c-wasm")
    built: dict[str, bytes] = {}

    def build(source: str) -> bytes:
        if clang is None:
            _missing("clang is not installed")
        key = hashlib.sha256(source.encode()).hexdigest()[:16]
        if key not in built:
            src = out_dir / f"{key}.c"
            out = out_dir / f"{key}.wasm"
            src.write_text(source)
            proc = subprocess.run(
                [str(clang), "--target=wasm32-wasi", "-O2", "-o", str(out), str(src)],
                capture_output=True,
                text=True,
                timeout=120,
            )
            if proc.returncode != 0:
                if "wasi" in proc.stderr and "not found" in proc.stderr:
                    _missing(f"clang cannot build for wasm32-wasi: {proc.stderr.strip()}")
                raise AssertionError(f"clang failed:\n{proc.stderr}")
            built[key] = out.read_bytes()
        return built[key]

    return build
