"""Latency of ``print(1)`` in Python: the nsjail warm pool vs one fresh nsjail per call.

Both paths use the same walls (namespaces, mounts, seccomp, rlimits, cgroups); the
baseline starts ``nsjail ... -- python3 -c 'print(1)'`` for every call, the pool forks the
warm zygote of a jail bound to the tenant. With ``--concurrency C`` the warm pool also
runs ``--concurrent-calls`` calls C at a time: the runtime alone, without the gateway, its
HTTP or its record, and what it costs the machine (``/proc/stat``) and this process (the
host side of the jails: the pool, the protocol to each jail's PID 1, its cgroup files) per
call, so what the jails take is the difference. Prints one JSON object.

    .venv/bin/python bench/nsjail_pool.py [-n 200] [--languages RUNS]      (as root)
    .venv/bin/python bench/nsjail_pool.py -n 50 --concurrency 32 --concurrent-calls 2400
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from typing import Any

from cost import machine_busy_s
from stats import latency_summary

from node.fncall.nsjail import NsjailBackend, NsjailConfig
from node.fncall.nsjail.command import JailCommand
from wire.execution import RunResult, RunSpec


def summary(samples_ms: list[float]) -> dict[str, Any]:
    return latency_summary(samples_ms)


def checked(result: RunResult) -> RunResult:
    """``result``, if it is the ``1`` that ``print(1)`` prints."""
    if result.run is None or result.run.stdout != "1\n":
        raise RuntimeError(f"unexpected result: {result}")
    return result


async def bench_pool(runtime: NsjailBackend, n: int) -> dict[str, Any]:
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
        checked(result)
        setup.append(result.setup_ms)
        exec_.append(result.exec_ms)
    return {
        "total": summary(total),
        "setup_p50_ms": summary(setup)["p50_ms"],
        "exec_p50_ms": summary(exec_)["p50_ms"],
    }


async def bench_concurrent(runtime: NsjailBackend, calls: int, concurrency: int) -> dict[str, Any]:
    """``calls`` of ``print(1)`` (rounded down to a multiple of ``concurrency``),
    ``concurrency`` at a time, on the warm pool: calls per second, and CPU milliseconds per
    call of the machine and of this process."""
    spec = RunSpec(language="python", code="print(1)")
    per_worker = calls // concurrency

    async def worker(k: int, n: int, tag: str) -> None:
        for i in range(n):
            checked(await runtime.run(spec, tenant_id="bench", invocation_id=f"{tag}-{k}-{i}"))

    # as many jails as the concurrency binds, warm before the clock starts
    await asyncio.gather(*(worker(k, 10, "warmup") for k in range(concurrency)))
    busy, mine, started = machine_busy_s(), os.times(), time.perf_counter()
    await asyncio.gather(*(worker(k, per_worker, "bench") for k in range(concurrency)))
    wall = time.perf_counter() - started
    busy, mine_after = machine_busy_s() - busy, os.times()
    done = per_worker * concurrency
    this = (mine_after.user + mine_after.system) - (mine.user + mine.system)
    return {
        "concurrency": concurrency,
        "calls": done,
        "calls_per_s": round(done / wall, 1),
        "machine_ms_per_call": round(1000 * busy / done, 3),
        "this_process_ms_per_call": round(1000 * this / done, 3),
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
    runtime = NsjailBackend(NsjailConfig(warm_per_language=1))
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


async def main(n: int, concurrency: int | None = None, calls: int = 2400) -> dict[str, Any]:
    config = NsjailConfig(languages=["python"], warm_per_language=1)
    runtime = NsjailBackend(config)
    started = time.perf_counter()
    await runtime.start()
    start_ms = (time.perf_counter() - started) * 1000
    concurrent: dict[str, Any] | None = None
    try:
        pool = await bench_pool(runtime, n)
        if concurrency is not None:
            concurrent = await bench_concurrent(runtime, calls, concurrency)
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
    } | ({"warm_pool_concurrent": concurrent} if concurrent is not None else {})


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-n", type=int, default=200)
    parser.add_argument(
        "--languages", type=int, metavar="RUNS", help="also time hello world per language"
    )
    parser.add_argument(
        "--concurrency", type=int, help="also run the warm pool this many calls at a time"
    )
    parser.add_argument(
        "--concurrent-calls",
        type=int,
        default=2400,
        help="calls of the --concurrency run (a jail is recycled after 500 uses: keep it "
        "under 500 times the jails the concurrency binds)",
    )
    args = parser.parse_args()
    report = asyncio.run(main(args.n, args.concurrency, args.concurrent_calls))
    if args.languages:
        report["hello_world_by_language"] = asyncio.run(bench_languages(args.languages))
    print(json.dumps(report, indent=2))
