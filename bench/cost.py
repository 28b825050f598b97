"""Cost benchmark: the same judged workload under two pool configurations, side by side,
with elapsed time and what it cost, the platform's idle capacity included.

For each configuration a fresh ``corral serve`` (embedded, nsjail, 8 slots) runs
``--programs`` programs of ``bench/reward.py``'s fixed mix at ``--concurrency``, then
waits for the node's next idle-capacity report (``CORRAL_USAGE_REPORT_SECONDS``, set
short here) and reads ``GET /v1/usage`` with the admin key: the tenant's use (CPU,
memory, transfer; waiting, setup and execution shares) and the platform's idle warm
capacity (instance-hours and memory of warm jails nobody used), priced at the server's
``CORRAL_PRICES`` (the defaults unless set). Configurations:

* ``cold``: no warm jail (``warm_per_language`` 0, ``max_warm_per_key`` 0), each jail used
  once: every program starts its own jail;
* ``warm``: the defaults (warm spares per language, jails reused up to 500 calls, pools
  sized from the arrival rate).

Prints one JSON document: per configuration, elapsed seconds, programs per second,
correct results, the usage rows and the cost per 1,000 correct results.

    .venv/bin/python bench/cost.py --programs 300 --concurrency 8
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
REPORT_S = 5.0


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
        started = time.perf_counter()
        run = asyncio.run(through_corral(server.url, key, work, args.concurrency))
        elapsed = time.perf_counter() - started
        time.sleep(REPORT_S * 2.5)  # the pools' idle capacity of the run reported and stored
        by_kind = usage(server, "tenant,kind")
        rows = by_kind["rows"]
        tenant = [r for r in rows if r["group"]["tenant"] == "bench"]
        platform = [r for r in rows if r["group"]["tenant"] == "(platform)"]
        cost = sum(r["cost"] for r in rows)
        return {
            "config": name,
            "nsjail": CONFIGS[name],
            "elapsed_s": round(elapsed, 2),
            "programs_per_s": run["programs_per_s"],
            "correct": run["correct"],
            "wrong": run["wrong"],
            "errors": run["errors"],
            "p50_ms": run["p50_ms"],
            "p99_ms": run["p99_ms"],
            "tenant": _summary(tenant),
            "platform_idle": _summary(platform),
            "cost_total": cost,
            "cost_per_1000_correct": cost / run["correct"] * 1000 if run["correct"] else None,
            "currency": by_kind["currency"],
        }
    finally:
        server.stop()


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("events", "cpu_s", "memory_gb_s", "instance_hours", "queue_s", "setup_s", "exec_s")
    out: dict[str, Any] = {k: sum(r[k] for r in rows) for k in keys}
    phases = out["queue_s"] + out["setup_s"] + out["exec_s"]
    for phase in ("queue", "setup", "exec"):
        out[f"{phase}_share"] = round(out[f"{phase}_s"] / phases, 3) if phases else 0.0
    out["cost"] = sum(r["cost"] for r in rows)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--slots", type=int, default=8)
    args = parser.parse_args()
    results = [measure(name, args) for name in ("cold", "warm")]
    cold, warm = results
    report = {
        "benchmark": "cost",
        "programs": args.programs,
        "concurrency": args.concurrency,
        "cpus": os.cpu_count(),
        "configs": results,
        "warm_vs_cold": {
            "elapsed": round(warm["elapsed_s"] / cold["elapsed_s"], 3),
            "cost": round(warm["cost_total"] / cold["cost_total"], 3)
            if cold["cost_total"]
            else None,
        },
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
