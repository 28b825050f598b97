"""Cluster benchmark: ``POST /v1/run`` through both gateways of a local cluster at once.

Starts a local cluster (deploy/cluster.py, what ``scripts/cluster`` runs: private
PostgreSQL and Redis, two ``corral gateway`` and three ``corral node`` processes) unless
``--dir`` names one that ``scripts/cluster start`` left running, then drives each gateway
from its own keep-alive connections, the load split evenly between them, at each
concurrency. Reports latency per gateway and combined, and how many executions each node
ran. Prints one JSON document.

    .venv/bin/python bench/cluster.py --requests 400 --concurrency 8,32
    .venv/bin/python bench/cluster.py --runtimes '["fake"]' --language fake --code '{}'
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import httpx
from httpload import load
from stats import latency_summary

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from deploy.cluster import Cluster, ClusterInfo, read_state  # noqa: E402

QUOTA = {"max_concurrent_executions": 1024, "executions_per_second": 100_000, "burst": 100_000}


def tenant_key(info: ClusterInfo) -> str:
    response = httpx.post(
        f"{info.gateways[0]}/v1/tenants",
        json={"name": f"bench-{os.getpid()}", "quota": QUOTA},
        headers={"Authorization": f"Bearer {info.admin_key}"},
        timeout=30,
    )
    response.raise_for_status()
    return str(response.json()["key"]["api_key"])


def node_executions(info: ClusterInfo) -> dict[str, float]:
    """Executions each node has run so far (all runtimes and outcomes)."""
    counts = {}
    for node in info.nodes:
        text = httpx.get(node.health.replace("/healthz", "/metrics"), timeout=10).text
        values = re.findall(r"^corral_node_executions_total\{[^}]*\} (\S+)$", text, re.MULTILINE)
        counts[node.id] = sum(float(v) for v in values)
    return counts


async def level(
    info: ClusterInfo, key: str, body: dict[str, Any], *, requests: int, concurrency: int
) -> dict[str, Any]:
    """``requests`` calls at ``concurrency``, split evenly over the gateways, at once."""
    headers = {"Authorization": f"Bearer {key}"}
    n = len(info.gateways)
    before = node_executions(info)
    runs = await asyncio.gather(
        *(
            load(
                url,
                "/v1/run",
                body,
                headers,
                requests=requests // n + (i < requests % n),
                concurrency=max(1, concurrency // n + (i < concurrency % n)),
            )
            for i, url in enumerate(info.gateways)
        )
    )
    after = node_executions(info)
    latencies = [ms for run in runs for ms in run[0]]
    wall = max(run[2] for run in runs)
    statuses: dict[str, int] = {}
    for _, outcomes, _ in runs:
        for outcome, count in outcomes.items():
            statuses[outcome] = statuses.get(outcome, 0) + count
    return {
        "concurrency": concurrency,
        "combined": latency_summary(latencies, wall_s=wall, errors=requests - len(latencies)),
        "per_gateway": [
            {"gateway": url, **latency_summary(lat, wall_s=w, errors=sum(out.values()) - len(lat))}
            for url, (lat, out, w) in zip(info.gateways, runs, strict=True)
        ],
        "per_node": {node: after[node] - before.get(node, 0.0) for node in after},
        "statuses": statuses,
    }


async def measure(info: ClusterInfo, key: str, args: argparse.Namespace) -> dict[str, Any]:
    body = {"language": args.language, "code": args.code}
    await level(info, key, body, requests=args.warmup, concurrency=8)
    return {
        "benchmark": "cluster",
        "cpus": os.cpu_count(),
        "gateways": len(info.gateways),
        "nodes": [n.id for n in info.nodes],
        "runtimes": args.runtimes,
        "language": args.language,
        "code": args.code,
        "levels": [
            await level(info, key, body, requests=args.requests, concurrency=int(c))
            for c in args.concurrency.split(",")
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--dir", type=Path, help="a running cluster (scripts/cluster start)")
    parser.add_argument("--gateways", type=int, default=2)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--runtimes", default='["nsjail"]', help="node backends, as JSON")
    parser.add_argument("--slots", type=int, default=4, help="slots of each started node")
    parser.add_argument("--language", default="python")
    parser.add_argument("--code", default="print(1)")
    parser.add_argument("--requests", type=int, default=400, help="per concurrency level")
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--concurrency", default="8,32", help="total, over all gateways")
    args = parser.parse_args()

    cluster = None
    try:
        if args.dir:
            state = read_state(args.dir)
            if state is None:
                parser.error(f"no cluster runs in {args.dir}")
            info = state[0]
        else:
            runtimes = json.loads(args.runtimes)
            env = {"CORRAL_NODE_SLOTS": str(args.slots)}
            if "fake" in runtimes:
                env["CORRAL_DEV_MODE"] = "1"
            cluster = Cluster(gateways=args.gateways, nodes=args.nodes, runtimes=runtimes, env=env)
            info = cluster.start()
        results = asyncio.run(measure(info, tenant_key(info), args))
    finally:
        if cluster is not None:
            cluster.stop()
            shutil.rmtree(cluster.dir, ignore_errors=True)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
