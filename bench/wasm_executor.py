"""The wasm worker's own cost per call: its executor alone, in one process, no jail, no HTTP.

Runs ``functions/fib-c`` (a raw C module, ``{"n": 20}`` on stdin) through
``WasmExecutor`` as the worker does for each ``run`` frame: the spec's model, a fresh
instance, the result's model. The executor's run dir is on ``/dev/shm``, a tmpfs as the
jailed worker's is. Each tree runs in a child process of its own, and with ``--compare``
the two trees alternate (after, before, before, after, ...), so a drift of the machine
falls on both. Reported per tree: calls per second at ``--concurrency``, CPU per call of
the event loop's thread (the worker's main thread, which every call crosses) and of the
whole process (the guest threads too). Prints JSON.

    .venv/bin/python bench/wasm_executor.py --calls 3000 --concurrency 32 --compare f5195b5
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from fncall import ROOT, export
from stats import alternate, medians

from functions import fib_module

EXPECT = '{"n": 20, "fib": 6765}\n'


def build_fib(out_dir: Path) -> Path:
    """``fib-c``'s module, built as ``bench/functions.py`` registers it."""
    out = out_dir / "fib.wasm"
    out.write_bytes(base64.b64decode(fib_module()))
    return out


def child(module: Path, calls: int, concurrency: int, warmup: int) -> dict[str, Any]:
    """In the child: check that the tree's own data plane was imported, then measure."""
    try:
        import node as plane
    except ImportError:  # a baseline from before the rename
        import runtimes as plane  # type: ignore[no-redef]

    tree = Path.cwd().resolve()
    if not Path(plane.__file__).resolve().is_relative_to(tree):
        raise RuntimeError(f"the data plane imported from {plane.__file__}, not from {tree}")
    return asyncio.run(_measure(module.read_bytes(), calls, concurrency, warmup))


async def _measure(raw: bytes, calls: int, concurrency: int, warmup: int) -> dict[str, Any]:
    import hashlib

    from wasmtime import Module

    from node.fncall.wasm.config import WasmConfig
    from node.fncall.wasm.executor import WasmExecutor
    from wire.execution import RunSpec

    sha256 = hashlib.sha256(raw).hexdigest()
    run_dir = Path(tempfile.mkdtemp(prefix="corral-bench-", dir="/dev/shm"))
    config = WasmConfig(
        data_dir=run_dir / "data", warm_per_language=0, max_warm_per_language=0, languages=[]
    )
    executor = WasmExecutor(config, run_dir / "instances")
    try:
        error = executor.load_module(sha256, Module(executor._engine.engine, raw).serialize())
        if error is not None:
            raise RuntimeError(error)
        await executor.start()
        frame = {"language": "wasm", "code": "", "stdin": '{"n": 20}'}

        async def one(i: int) -> None:
            spec = RunSpec.model_validate(frame)
            result = await executor.run(spec, invocation_id=f"b{i}", module=sha256)
            assert result is not None and result.run is not None, result
            result.model_dump(mode="json")
            if result.run.stdout != EXPECT:
                raise RuntimeError(f"call {i}: {result.run!r}")

        for i in range(warmup):
            await one(i)
        gate = asyncio.Semaphore(concurrency)

        async def limited(i: int) -> None:
            async with gate:
                await one(i)

        wall0, main0, proc0 = time.perf_counter(), time.thread_time(), time.process_time()
        await asyncio.gather(*(limited(i) for i in range(calls)))
        wall = time.perf_counter() - wall0
        main_cpu, proc_cpu = time.thread_time() - main0, time.process_time() - proc0
    finally:
        await executor.close()
        shutil.rmtree(run_dir, ignore_errors=True)
    return {
        "calls_per_s": round(calls / wall, 1),
        "main_thread_cpu_ms_per_call": round(main_cpu / calls * 1000, 3),
        "process_cpu_ms_per_call": round(proc_cpu / calls * 1000, 3),
    }


def run_tree(tree: Path, module: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One measurement of ``tree``'s executor, in a child process importing that tree."""
    argv = [sys.executable, str(Path(__file__).resolve()), "--child", str(module)]
    argv += ["--calls", str(args.calls), "--concurrency", str(args.concurrency)]
    argv += ["--warmup", str(args.warmup)]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(argv, env=env, cwd=tree, check=True, capture_output=True, text=True)
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2, help="runs of each tree")
    parser.add_argument("--compare", help="also measure the executor of this earlier commit")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        sys.path.insert(0, os.environ["PYTHONPATH"])
        print(json.dumps(child(args.child, args.calls, args.concurrency, args.warmup)))
        return
    work = Path(tempfile.mkdtemp(prefix="corral-wasm-executor-"))
    try:
        module = build_fib(work)
        trees = {"after": ROOT}
        if args.compare:
            trees["before"] = export(args.compare)
        runs = alternate(trees, args.rounds, lambda tree: run_tree(tree, module, args))
        report: dict[str, Any] = {
            "benchmark": "wasm_executor",
            "cpus": os.cpu_count(),
            "calls": args.calls,
            "concurrency": args.concurrency,
            "runs": runs["after"],
            "median": medians(runs["after"]),
        }
        if "before" in runs:
            before = medians(runs["before"])
            report["before"] = {"revision": args.compare, "runs": runs["before"], "median": before}
            report["ratio_to_before"] = {
                key: round(value / before[key], 3) for key, value in report["median"].items()
            }
        print(json.dumps(report, indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if args.compare:
            shutil.rmtree(trees["before"], ignore_errors=True)


if __name__ == "__main__":
    main()
