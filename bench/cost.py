"""Cost benchmark: the same judged workload under two pool configurations, side by side,
with elapsed time and what it cost, the platform's idle capacity included.

The workload is a training run's reward calls: ``--programs`` programs of
``bench/reward.py``'s fixed mix in ``--steps`` batches, each at ``--concurrency``, with
``--gap-s`` between batches while the trainer would be generating (warm capacity is held
idle then). For each configuration a fresh ``corral serve`` (embedded, nsjail, 8 slots)
warms up, reports its idle capacity so far (the baseline, subtracted), runs the batches,
waits for the node's next usage report (``CORRAL_USAGE_REPORT_SECONDS``, 1 s here) and
reads ``GET /v1/usage`` with the admin key: the tenant's use (CPU, memory, instance time
from each call's setup to its teardown, transfer; waiting, setup and execution shares)
and the platform's idle warm capacity during the run, priced at the server's
``CORRAL_PRICES`` (the defaults unless set). Configurations:

* ``cold``: no warm jail (``warm_per_language`` 0, ``max_warm_per_key`` 0), each jail used
  once: every program starts its own jail;
* ``warm``: the defaults (warm spares per language, jails reused up to 500 calls, pools
  sized from the arrival rate).

Prints one JSON document: per configuration, elapsed and busy seconds, programs per busy
second, correct results, each batch's p50 and p99, the machine's CPU-seconds busy during
the run (everything on it, the load generator included), the usage and the cost per
1,000 correct results.

    .venv/bin/python bench/cost.py --programs 300 --concurrency 8 --steps 5 --gap-s 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from typing import Any

import httpx
from fncall import Server
from reward import programs, through_corral

CONFIGS: dict[str, dict[str, Any]] = {
    "cold": {"warm_per_language": 0, "max_warm_per_key": 0, "max_uses_per_jail": 1},
    "warm": {},
}
REPORT_S = 1.0


def usage(server: Server, group_by: str) -> dict[str, Any]:
    response = httpx.get(
        f"{server.url}/v1/usage",
        params={"group_by": group_by},
        headers={"Authorization": f"Bearer {server.admin_key}"},
        timeout=30,
    )
    response.raise_for_status()
    return response.json()  # type: ignore[no-any-return]


def measure(name: str, args: argparse.Namespace) -> dict[str, Any]:
    env = {
        "CORRAL_NSJAIL": json.dumps(CONFIGS[name]),
        "CORRAL_USAGE_REPORT_SECONDS": str(REPORT_S),
    }
    server = Server(args.slots, "nsjail", env=env)
    try:
        server.wait_ready()
        key = server.tenant_key()
        work = programs(args.programs)
        size = -(-len(work) // args.steps)
        time.sleep(REPORT_S * 2.5)  # the warm-up's idle capacity reported: the baseline
        idle_before = _summary(_platform(usage(server, "tenant,kind")["rows"]))
        busy_before, started = machine_busy_s(), time.perf_counter()
        steps = []
        for step in range(args.steps):
            if step:
                time.sleep(args.gap_s)  # the trainer generating the next batch
            batch = work[step * size : (step + 1) * size]
            t0 = time.perf_counter()
            steps.append(asyncio.run(through_corral(server.url, key, batch, args.concurrency)))
            steps[-1]["wall_s"] = time.perf_counter() - t0
        elapsed = time.perf_counter() - started
        machine_cpu_s = machine_busy_s() - busy_before
        time.sleep(REPORT_S * 2.5)  # the run's idle capacity reported and stored
        by_kind = usage(server, "tenant,kind")
        tenant = _summary([r for r in by_kind["rows"] if r["group"]["tenant"] == "bench"])
        idle = _summary(_platform(by_kind["rows"]))
        idle = {k: v - idle_before[k] if k in SUMMED else v for k, v in idle.items()}
        _shares(idle)
        cost = tenant["cost"] + idle["cost"]
        correct = sum(s["correct"] for s in steps)
        return {
            "config": name,
            "nsjail": CONFIGS[name],
            "elapsed_s": round(elapsed, 2),
            "busy_s": round(sum(s["wall_s"] for s in steps), 2),
            "programs_per_busy_s": round(len(work) / sum(s["wall_s"] for s in steps), 1),
            "correct": correct,
            "wrong": sum(s["wrong"] for s in steps),
            "errors": sum(s["errors"] for s in steps),
            "step_p50_ms": [s["p50_ms"] for s in steps],
            "step_p99_ms": [s["p99_ms"] for s in steps],
            "machine_cpu_s": round(machine_cpu_s, 2),
            "tenant": tenant,
            "platform_idle": idle,
            "cost_total": cost,
            "cost_per_1000_correct": cost / correct * 1000 if correct else None,
            "currency": by_kind["currency"],
        }
    finally:
        server.stop()


def _platform(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r["group"]["tenant"] == "(platform)"]


def machine_busy_s() -> float:
    """CPU-seconds the whole machine spent busy so far (``/proc/stat``: all but idle and
    iowait): the platform's own work to start jails and record calls, which no usage row
    prices as such, and the load generator's."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


SUMMED = (
    *("events", "cpu_s", "memory_gb_s", "instance_hours", "queue_s", "setup_s", "exec_s"),
    *("cost", "cost_cpu", "cost_memory", "cost_instances", "cost_transfer"),
)


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {k: sum(r[k] for r in rows) for k in SUMMED}
    _shares(out)
    return out


def _shares(out: dict[str, Any]) -> None:
    phases = out["queue_s"] + out["setup_s"] + out["exec_s"]
    for phase in ("queue", "setup", "exec"):
        out[f"{phase}_share"] = round(out[f"{phase}_s"] / phases, 3) if phases else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5, help="training steps (batches)")
    parser.add_argument(
        "--gap-s", type=float, default=2.0, help="between steps: the trainer generating"
    )
    args = parser.parse_args()
    results = [measure(name, args) for name in ("cold", "warm")]
    cold, warm = results
    report = {
        "benchmark": "cost",
        "programs": args.programs,
        "concurrency": args.concurrency,
        "steps": args.steps,
        "gap_s": args.gap_s,
        "cpus": os.cpu_count(),
        "configs": results,
        "warm_vs_cold": {
            "elapsed": round(warm["elapsed_s"] / cold["elapsed_s"], 3),
            "busy": round(warm["busy_s"] / cold["busy_s"], 3),
            "cost": round(warm["cost_total"] / cold["cost_total"], 3)
            if cold["cost_total"]
            else None,
            "machine_cpu": round(warm["machine_cpu_s"] / cold["machine_cpu_s"], 3),
        },
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
