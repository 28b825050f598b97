"""Latency of ``print(1)`` in Python: the nsjail warm pool vs one fresh nsjail per call.

Both paths use the same walls (namespaces, mounts, seccomp, rlimits, cgroups); the
baseline starts ``nsjail ... -- python3 -c 'print(1)'`` for every call, the pool forks the
warm zygote of a jail bound to the tenant. Prints one JSON object.

    .venv/bin/python bench/nsjail_pool.py [-n 200] [--languages RUNS]      (as root)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from typing import Any

from stats import latency_summary

from runtimes.nsjail import NsjailConfig, NsjailRuntime
from runtimes.nsjail.command import JailCommand
from wire.execution import RunSpec


def summary(samples_ms: list[float]) -> dict[str, Any]:
    return latency_summary(samples_ms)


async def bench_pool(runtime: NsjailRuntime, n: int) -> dict[str, Any]:
    spec = RunSpec(language="python", code="print(1)")
    for i in range(5):  # bind a jail to the tenant; first calls warm the page cache
        await runtime.run(spec, tenant_id="bench", invocation_id=f"warmup-{i}")
    total: list[float] = []
    setup: list[float] = []
    exec_: list[float] = []
    for i in range(n):
        started = time.perf_counter()
        result = await runtime.run(spec, tenant_id="bench", invocation_id=f"bench-{i}")
        total.append((time.perf_counter() - started) * 1000)
        if result.run is None or result.run.stdout != "1\n":
            raise RuntimeError(f"unexpected result: {result}")
        setup.append(result.setup_ms)
        exec_.append(result.exec_ms)
    return {
        "total": summary(total),
        "setup_p50_ms": summary(setup)["p50_ms"],
        "exec_p50_ms": summary(exec_)["p50_ms"],
    }


async def bench_one_shot(command: JailCommand, python: str, n: int) -> dict[str, Any]:
    samples: list[float] = []
    for i in range(n):
        started = time.perf_counter()
        # the same walls as a pool jail: its own cgroups (v1: made by the host, nsjail
        # started inside them), made and removed per call
        cgroup = command.cgroups.for_new_jail(
            f"oneshot-{os.getpid()}-{i}",
            memory_bytes=512 << 20,
            pids=64,
            cpu_ms_per_sec=command.config.cpu_ms_per_sec,
        )
        try:
            argv = command.one_shot_argv(
                hostname=f"oneshot-{i}",
                command=[python, "-I", "-c", "print(1)"],
                memory_mb=512,
                join_cgroups=cgroup.procs_files() if cgroup is not None else (),
            )
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.DEVNULL,
                env={"PATH": "/usr/bin:/bin"},
            )
            out, _ = await proc.communicate()
        finally:
            if cgroup is not None:
                cgroup.remove()
        samples.append((time.perf_counter() - started) * 1000)
        if out != b"1\n" or proc.returncode != 0:
            raise RuntimeError(f"one-shot jail failed: rc={proc.returncode} out={out!r}")
    return {"total": summary(samples)}


HELLO = {
    "python": "print('hi')",
    "bash": "echo hi",
    "perl": 'print "hi\\n";',
    "nodejs": "console.log('hi')",
    "cpp": '#include <cstdio>\nint main() { std::puts("hi"); }',
    "rust": 'fn main() { println!("hi"); }',
    "java": (
        "public class Main {\n"
        '  public static void main(String[] a) { System.out.println("hi"); }\n'
        "}"
    ),
}


async def bench_languages(runs: int) -> dict[str, Any]:
    """Warm hello world per language: total, compile and run stage wall times (p50)."""
    runtime = NsjailRuntime(NsjailConfig(warm_per_language=1))
    await runtime.start()
    out: dict[str, Any] = {}
    try:
        for info in runtime.languages():
            spec = RunSpec(language=info.name, code=HELLO[info.name])
            total: list[float] = []
            compile_ms: list[float] = []
            run_ms: list[float] = []
            for i in range(runs):
                started = time.perf_counter()
                result = await runtime.run(
                    spec, tenant_id="bench", invocation_id=f"{info.name}-{i}"
                )
                total.append((time.perf_counter() - started) * 1000)
                if not result.succeeded or result.run is None or result.run.stdout != "hi\n":
                    raise RuntimeError(f"{info.name}: unexpected result {result}")
                run_ms.append(result.run.wall_ms)
                if result.compile is not None:
                    compile_ms.append(result.compile.wall_ms)
            out[info.name] = {
                "total_p50_ms": summary(total)["p50_ms"],
                "run_p50_ms": summary(run_ms)["p50_ms"],
                "compile_p50_ms": summary(compile_ms)["p50_ms"] if compile_ms else None,
            }
    finally:
        await runtime.close()
    return out


async def main(n: int) -> dict[str, Any]:
    config = NsjailConfig(languages=["python"], warm_per_language=1)
    runtime = NsjailRuntime(config)
    started = time.perf_counter()
    await runtime.start()
    start_ms = (time.perf_counter() - started) * 1000
    try:
        pool = await bench_pool(runtime, n)
        command = runtime._command
        assert command is not None
        one_shot = await bench_one_shot(command, config.python_path, n)
    finally:
        await runtime.close()
    return {
        "benchmark": "nsjail print(1)",
        "cpus": os.cpu_count(),
        "runtime_start_ms": round(start_ms, 1),
        "warm_pool": pool,
        "one_shot_nsjail": one_shot,
        "speedup_p50": round(one_shot["total"]["p50_ms"] / pool["total"]["p50_ms"], 1),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-n", type=int, default=200)
    parser.add_argument(
        "--languages", type=int, metavar="RUNS", help="also time hello world per language"
    )
    args = parser.parse_args()
    report = asyncio.run(main(args.n))
    if args.languages:
        report["hello_world_by_language"] = asyncio.run(bench_languages(args.languages))
    print(json.dumps(report, indent=2))
