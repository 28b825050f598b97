"""Latency of the wasm runtime: the pre-initialised Python, QuickJS's warm pool, a C module.

* ``python``: ``print(1)`` on the pre-initialised CPython component, a fresh instance of
  its snapshot per call (there is no pool to wait for);
* ``python_back_to_back``: the same with no pause between calls (what it sustains);
* ``javascript_warm``: ``console.log(1)`` on a pre-started QuickJS instance;
* ``javascript_fresh``: the same with an empty pool, so every call starts its
  interpreter (the baseline: a fresh instance of a command module per call);
* ``c_module``: a tiny C program (fib(20)) as a raw module, a fresh instance per call
  from the cached ``InstancePre``.

Prints one JSON object. Needs clang for the C case and scripts/setup-wasm.sh for QuickJS.

    .venv/bin/python bench/wasm_pool.py [-n 200] [--data-dir DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from stats import latency_summary

from node.fncall.wasm import WasmBackend, WasmConfig
from wire.execution import RunSpec

C_FIB = r"""
#include <stdio.h>
static int fib(int n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }
int main(void) { printf("%d\n", fib(20)); return 0; }
"""


def summary(samples_ms: list[float]) -> dict[str, Any]:
    return latency_summary(samples_ms)


async def wait_warm(rt: WasmBackend, want: int, timeout: float = 10.0) -> None:
    for _ in range(int(timeout / 0.005)):
        if rt.stats()["warm"] >= want:
            return
        await asyncio.sleep(0.005)


async def measure(
    rt: WasmBackend, spec: RunSpec, expect: str, n: int, *, warm: int = 0
) -> dict[str, Any]:
    total: list[float] = []
    setup: list[float] = []
    exec_: list[float] = []
    teardown: list[float] = []
    for i in range(n):
        if warm:
            await wait_warm(rt, warm)
        started = time.perf_counter()
        result = await rt.run(spec, tenant_id="bench", invocation_id=f"bench-{i}")
        total.append((time.perf_counter() - started) * 1000)
        if result.run is None or result.run.stdout != expect:
            raise RuntimeError(f"unexpected result: {result}")
        setup.append(result.setup_ms)
        exec_.append(result.exec_ms)
        teardown.append(result.teardown_ms)
    return {
        "total": summary(total),
        "setup_p50_ms": summary(setup)["p50_ms"],
        "exec_p50_ms": summary(exec_)["p50_ms"],
        "teardown_p50_ms": summary(teardown)["p50_ms"],
    }


async def back_to_back(rt: WasmBackend, spec: RunSpec, n: int) -> dict[str, Any]:
    started = time.perf_counter()
    samples: list[float] = []
    for i in range(n):
        t = time.perf_counter()
        await rt.run(spec, tenant_id="bench", invocation_id=f"b2b-{i}")
        samples.append((time.perf_counter() - t) * 1000)
    elapsed = time.perf_counter() - started
    return {"total": summary(samples), "calls_per_s": round(n / elapsed, 1)}


def build_c(out_dir: Path) -> bytes | None:
    clang = shutil.which("clang")
    if clang is None:
        return None
    src, out = out_dir / "fib.c", out_dir / "fib.wasm"
    src.write_text(C_FIB)
    subprocess.run([clang, "--target=wasm32-wasi", "-O2", "-o", str(out), str(src)], check=True)
    return out.read_bytes()


@contextlib.asynccontextmanager
async def started(rt: WasmBackend) -> AsyncIterator[WasmBackend]:
    await rt.start()
    try:
        yield rt
    finally:
        await rt.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=200)
    parser.add_argument("--data-dir", type=Path, default=Path("var"))
    args = parser.parse_args()
    n: int = args.n
    py = RunSpec(language="wasm-python", code="print(1)")
    report: dict[str, Any] = {"n": n}

    def runtime(language: str, warm: int) -> WasmBackend:
        # a pool pinned at ``warm`` instances (min = max): the measured demand does not
        # resize it, so ``warm=0`` really starts a fresh instance for every call
        config = WasmConfig(
            data_dir=args.data_dir,
            warm_per_language=warm,
            max_warm_per_language=warm,
            languages=[language],
        )
        return WasmBackend(config)

    async with started(runtime("wasm-python", 0)) as rt:
        for i in range(5):
            await rt.run(py, tenant_id="bench", invocation_id=f"warmup-{i}")
        report["python"] = await measure(rt, py, "1\n", n)
        report["python_back_to_back"] = await back_to_back(rt, py, n)
    js = RunSpec(language="wasm-javascript", code="console.log(1)")
    async with started(runtime("wasm-javascript", 4)) as rt:
        if rt.languages()[0].name == "wasm-javascript":
            report["javascript_warm"] = await measure(rt, js, "1\n", n, warm=4)
    async with started(runtime("wasm-javascript", 0)) as rt:
        if rt.languages()[0].name == "wasm-javascript":
            report["javascript_fresh"] = await measure(rt, js, "1\n", n)
    with tempfile.TemporaryDirectory() as tmp:
        module = build_c(Path(tmp))
    if module is not None:
        async with started(runtime("wasm", 0)) as rt:
            c = RunSpec(
                language="wasm", code="", files={"module.wasm": base64.b64encode(module).decode()}
            )
            await rt.run(c, tenant_id="bench", invocation_id="c-warmup")
            report["c_module"] = await measure(rt, c, "6765\n", n)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
