"""Shared fixtures for the real-nsjail tests.

Each test module starts one ``NsjailBackend`` for all its tests (a module-scoped event
loop), so the suite pays for warming the pools once per module.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import pytest
import pytest_asyncio

from node.fncall.nsjail import NsjailBackend, NsjailConfig
from wire.execution import RunLimits, RunResult, RunSpec

RunFn = Callable[..., Coroutine[Any, Any, RunResult]]


def make_runtime(**overrides: Any) -> NsjailBackend:
    settings: dict[str, Any] = {"warm_per_language": 1, "max_jails": 12, "reap_interval_s": 0.5}
    settings.update(overrides)
    return NsjailBackend(NsjailConfig.model_validate(settings))


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def runtime() -> AsyncIterator[NsjailBackend]:
    """A started runtime with the cheap-to-start languages (compilers only where needed)."""
    rt = make_runtime(languages=["python", "bash", "cpp"])
    await rt.start()
    try:
        yield rt
    finally:
        await rt.close()


def limits(**kw: Any) -> RunLimits:
    base: dict[str, Any] = {"run_timeout_s": 5.0, "compile_timeout_s": 30.0, "memory_mb": 256}
    base.update(kw)
    return RunLimits(**base)


_counter = 0


async def run_code(
    rt: NsjailBackend,
    code: str,
    *,
    language: str = "python",
    tenant: str = "tenant-a",
    stdin: str = "",
    files: dict[str, str] | None = None,
    fetch: list[str] | None = None,
    **limit_overrides: Any,
) -> RunResult:
    global _counter
    _counter += 1
    spec = RunSpec(
        language=language,
        code=code,
        stdin=stdin,
        files=files or {},
        fetch_files=fetch or [],
        limits=limits(**limit_overrides),
    )
    return await rt.run(spec, tenant_id=tenant, invocation_id=f"test-{_counter}")


async def assert_still_works(
    rt: NsjailBackend, *, language: str = "python", tenant: str = "tenant-a"
) -> None:
    """The pool of (tenant, language) serves a normal call after whatever came before."""
    code = {"python": "print('still ok')", "bash": "echo still ok"}[language]
    result = await run_code(rt, code, language=language, tenant=tenant)
    assert result.error is None, result.error
    assert result.run is not None and result.run.ok, result.run
    assert result.run.stdout == "still ok\n"


@pytest.fixture(scope="session")
def run() -> RunFn:
    """``await run(rt, code, language=..., tenant=..., stdin=..., **limits)``."""
    return run_code


@pytest.fixture(scope="session")
def still_works() -> Callable[..., Coroutine[Any, Any, None]]:
    return assert_still_works


@pytest.fixture(scope="session")
def new_runtime() -> Callable[..., NsjailBackend]:
    """``new_runtime(**config_overrides)``: an unstarted runtime with test defaults."""
    return make_runtime


@pytest_asyncio.fixture(loop_scope="module")
async def python_only(
    new_runtime: Callable[..., NsjailBackend],
) -> AsyncIterator[Callable[..., Coroutine[Any, Any, NsjailBackend]]]:
    """``await make(**config)``: a started python-only runtime, closed after the test."""
    started: list[NsjailBackend] = []

    async def make(**overrides: Any) -> NsjailBackend:
        rt = new_runtime(languages=["python"], **overrides)
        await rt.start()
        started.append(rt)
        return rt

    yield make
    for rt in started:
        await rt.close()
