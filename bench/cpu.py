"""Where a call's CPU goes: per process and per thread, of the server's whole tree.

Runs a workload at one concurrency against a fresh ``corral serve`` and reads
``/proc/<pid>/task/*/stat`` of every process of the server's tree before and after, and
``/proc/stat`` for the machine: CPU milliseconds per call of each process's busiest
threads, of the machine, and of this load generator, and the machine's context switches
per call. A process that starts and ends within the run (a jail's per-call child) is
charged to the process that waited for it (``reaped_ms_per_call``: the kernel adds an
ended child's CPU, and that of the children it waited for, to its parent's ``cutime``
and ``cstime`` when the parent waits for it). The tree is read again at the end, so a
process started during the run (a jail replacing a recycled one) is counted from its
start; one that ended (the recycled jail) is in its parent's ``reaped_ms_per_call``, with
all of its life's CPU, from before the run too (so keep the run short of recycling).
Each process is named with its parent's name, so a jail's PID 1 (parent ``nsjail``)
tells from its template (parent ``python3``). What neither the tree nor the load
generator accounts for (the kernel's work in interrupts and its own threads, other
processes) is ``unaccounted_ms_per_call``. The baseline in the same run is the gateway
alone (the fake runtime, ``/v1/run``), so a row shows what its runtime adds. With ``--compare
REV`` the workload also runs on that commit's tree, the two alternating (this tree, REV,
REV, this tree, ...), so a drift of the machine falls on both. With ``--pin-server`` the
server's threads run on one CPU and everything else (the rest of its tree, this load
generator) on the others: the server with a core of its own, which shows what a call costs
it when nothing else runs there and what rate that allows. A process the server starts
afterwards would inherit its CPU, so the ``nsjail`` workload, whose jails the server
starts while it runs, is refused. Prints JSON.

    .venv/bin/python bench/cpu.py --workload fib-c --requests 6000 --concurrency 32
    .venv/bin/python bench/cpu.py --workload nsjail --requests 4000 --concurrency 32
    .venv/bin/python bench/cpu.py --workload fib-c --requests 4000 --compare HEAD~1
    .venv/bin/python bench/cpu.py --workload fib-c --requests 4000 --pin-server
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
from collections import defaultdict
from pathlib import Path
from typing import Any

from cost import machine_busy_s
from fncall import ROOT, Server, dev_env, export
from httpload import load
from stats import alternate, medians

from functions import fib_module, register

TICK = os.sysconf("SC_CLK_TCK")
#: workload -> (runtimes of the server, path, body, whether it registers ``fib-c`` first)
WORKLOADS: dict[str, tuple[str, str, dict[str, Any], bool]] = {
    "fake": ("fake", "/v1/run", {"language": "fake", "code": "{}"}, False),
    "nsjail": ("nsjail", "/v1/run", {"language": "python", "code": "print(1)"}, False),
    "fib-c": ("nsjail,wasm", "/v1/functions/fib-c/invoke", {"n": 20}, True),
}


def tree(pid: int) -> list[int]:
    """``pid`` and its descendants."""
    found = [pid]
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                for child in f.read().split():
                    found += tree(int(child))
    except FileNotFoundError:
        pass
    return found


def threads(pids: list[int]) -> dict[tuple[int, int], tuple[str, float]]:
    """(pid, tid) -> (the process's name, the thread's CPU seconds)."""
    out: dict[tuple[int, int], tuple[str, float]] = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/comm") as f:
                name = f.read().strip()
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                out[(pid, int(tid))] = (name, (int(fields[11]) + int(fields[12])) / TICK)
        except FileNotFoundError:
            continue
    return out


def process_stats(pids: list[int]) -> dict[int, tuple[str, str, float]]:
    """pid -> (its name, its parent's name, the CPU seconds of its ended children that it
    has waited for, and theirs in turn: ``cutime`` + ``cstime``)."""
    out: dict[int, tuple[str, str, float]] = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
            fields = stat.rsplit(")", 1)[1].split()
            with open(f"/proc/{fields[1]}/comm") as f:
                parent = f.read().strip()
        except FileNotFoundError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        out[pid] = (name, parent, (int(fields[13]) + int(fields[14])) / TICK)
    return out


def pin(server_pid: int, others: list[int]) -> tuple[set[int], set[int]]:
    """Every thread of ``server_pid`` onto the first CPU this process may use, every
    thread of ``others`` (and of this process) onto the rest; (server's, others' CPUs).
    A thread or process started later inherits the CPUs of the thread that starts it."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("--pin-server needs at least two CPUs")
    server_cpus, other_cpus = {cpus[0]}, set(cpus[1:])
    for pid, cpu_set in [(server_pid, server_cpus), *((other, other_cpus) for other in others)]:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(ProcessLookupError):
                os.sched_setaffinity(int(tid), cpu_set)
    os.sched_setaffinity(0, other_cpus)
    return server_cpus, other_cpus


def context_switches() -> int:
    """The machine's context switches so far (``/proc/stat``'s ``ctxt``)."""
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("ctxt "):
                return int(line.split()[1])
    raise RuntimeError("/proc/stat has no ctxt line")


def measure(
    workload: str, requests: int, concurrency: int, root: Path = ROOT, *, pin_server: bool = False
) -> dict[str, Any]:
    runtimes, path, body, registers_fib = WORKLOADS[workload]
    everywhere = os.sched_getaffinity(0)
    pinned: dict[str, list[int]] | None = None
    server = Server(8, runtimes, root=root, env=dev_env(runtimes))
    try:
        server.wait_ready()
        key = server.tenant_key()
        if registers_fib:
            register(
                server.url,
                key,
                {
                    "name": "fib-c",
                    "language": "wasm",
                    "module_base64": fib_module(),
                    "input_schema": {"type": "object"},
                },
            )
        headers = {"Authorization": f"Bearer {key}"}
        asyncio.run(load(server.url, path, body, headers, requests=300, concurrency=8))
        pids = tree(server.proc.pid)
        if pin_server:
            server_cpus, other_cpus = pin(server.proc.pid, pids[1:])
            pinned = {"server_cpus": sorted(server_cpus), "others_cpus": sorted(other_cpus)}
        before, busy0, mine0 = threads(pids), machine_busy_s(), os.times()
        reaped0, switches0 = process_stats(pids), context_switches()
        latencies, statuses, wall = asyncio.run(
            load(server.url, path, body, headers, requests=requests, concurrency=concurrency)
        )
        # with the processes started during the run (a jail that replaced a recycled one)
        pids = sorted({*pids, *tree(server.proc.pid)})
        after, busy1, mine1 = threads(pids), machine_busy_s(), os.times()
        reaped1, switches1 = process_stats(pids), context_switches()
    finally:
        server.stop()
        os.sched_setaffinity(0, everywhere)
    per_process: dict[int, list[float]] = defaultdict(list)
    names: dict[int, str] = {}
    for (pid, tid), (name, cpu) in after.items():
        spent = cpu - before.get((pid, tid), (name, 0.0))[1]
        per_process[pid].append(spent)
        names[pid] = name
    processes = []
    accounted = 0.0
    for pid, spent in per_process.items():
        total = sum(spent)
        # a process started during the run has no earlier children; one that ended
        # between the two reads at the end has no reading
        reaped = reaped1[pid][2] - reaped0.get(pid, ("", "", 0.0))[2] if pid in reaped1 else 0.0
        accounted += total + reaped
        if (total + reaped) * 1000 / requests < 0.01:
            continue
        spent.sort(reverse=True)
        processes.append(
            {
                "process": names[pid],
                "parent": reaped1[pid][1] if pid in reaped1 else None,
                "server": pid == server.proc.pid,
                "ms_per_call": round(1000 * total / requests, 3),
                "reaped_ms_per_call": round(1000 * reaped / requests, 3),
                "busiest_thread_ms_per_call": round(1000 * spent[0] / requests, 3),
                "next_thread_ms_per_call": round(1000 * spent[1] / requests, 3)
                if len(spent) > 1
                else 0.0,
                "threads": len(spent),
            }
        )
    processes.sort(key=lambda p: -(float(p["ms_per_call"]) + float(p["reaped_ms_per_call"])))
    mine = (mine1.user + mine1.system) - (mine0.user + mine0.system)
    return {
        "workload": workload,
        "concurrency": concurrency,
        "calls": requests,
        "statuses": statuses,
        "calls_per_s": round(len(latencies) / wall, 1),
        "machine_busy_percent": round(100 * (busy1 - busy0) / wall),
        "machine_ms_per_call": round(1000 * (busy1 - busy0) / requests, 3),
        "load_generator_ms_per_call": round(1000 * mine / requests, 3),
        "unaccounted_ms_per_call": round(1000 * (busy1 - busy0 - mine - accounted) / requests, 3),
        "machine_context_switches_per_call": round((switches1 - switches0) / requests, 1),
        "processes": processes,
    } | ({"pinned": pinned} if pinned is not None else {})


#: the figures of a run whose median over runs is reported with ``--compare``
COMPARED = (
    "calls_per_s",
    "machine_ms_per_call",
    "machine_context_switches_per_call",
    "machine_busy_percent",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="fib-c")
    parser.add_argument("--requests", type=int, default=6000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--compare", help="also run the workload on this earlier commit")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each tree with --compare")
    parser.add_argument(
        "--pin-server", action="store_true", help="the server on one CPU, all else on the rest"
    )
    args = parser.parse_args()
    pin_server = args.pin_server
    if pin_server and args.workload == "nsjail":
        parser.error("--pin-server: the server starts the nsjail workload's jails (see above)")
    result: dict[str, Any] = {"benchmark": "cpu", "cpus": os.cpu_count()}
    if not args.compare:
        result["run"] = measure(
            args.workload, args.requests, args.concurrency, pin_server=pin_server
        )
    else:
        trees = {"after": ROOT, "before": export(args.compare)}
        try:
            runs = alternate(
                trees,
                args.rounds,
                lambda root: measure(
                    args.workload, args.requests, args.concurrency, root, pin_server=pin_server
                ),
            )
        finally:
            shutil.rmtree(trees["before"], ignore_errors=True)
        after, before = medians(runs["after"], COMPARED), medians(runs["before"], COMPARED)
        result["runs"] = runs["after"]
        result["median"] = after
        result["before"] = {"revision": args.compare, "runs": runs["before"], "median": before}
        result["ratio_to_before"] = {
            key: round(value / before[key], 3) if before[key] else None
            for key, value in after.items()
        }
    result["baseline_gateway_alone"] = measure(
        "fake", args.requests, args.concurrency, pin_server=pin_server
    )
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
