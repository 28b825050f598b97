"""Tool-function benchmark: invoke latency and throughput through HTTP.

In one run against one ``corral serve`` (nsjail and wasm backends), it registers and
invokes three functions: a tiny C function compiled to a WASI module (``fib``), a Python
function on CPython-in-wasm, and the same Python function on nsjail, each at several
concurrencies. The nsjail and wasm-python rows are each other's baseline. Prints JSON.

    .venv/bin/python bench/functions.py --requests 300 --concurrency 1,32
    .venv/bin/python bench/functions.py --compare a4ab1bb   # before and after, same run
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import httpx
from fncall import Server, export, side_by_side, summary
from httpload import load

ROOT = Path(__file__).resolve().parents[1]
PYTHON_HANDLER = "def handler(event):\n    return {'sum': event['a'] + event['b']}\n"
SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
}


def fib_module() -> str:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "fib.wasm"
        subprocess.run(
            [
                "clang",
                "--target=wasm32-wasi",
                "-O2",
                "-o",
                str(out),
                str(ROOT / "functions/fib-c/fib.c"),
            ],
            check=True,
        )
        return base64.b64encode(out.read_bytes()).decode()


def register(url: str, key: str, body: dict[str, Any]) -> None:
    response = httpx.post(
        f"{url}/v1/functions", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=120
    )
    if response.status_code >= 300:
        raise RuntimeError(f"registering {body['name']}: {response.status_code} {response.text}")


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def drive(
    url: str, key: str, name: str, payload: Any, *, requests: int, concurrency: int
) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {key}"}
    timings: list[dict[str, Any]] = []
    latencies, outcomes, wall = await load(
        url,
        f"/v1/functions/{name}/invoke",
        payload,
        headers,
        requests=requests,
        concurrency=concurrency,
        timings=timings,
    )
    result = summary(latencies, wall, requests - len(latencies))
    result.update(function=name, concurrency=concurrency, outcomes=outcomes)
    result["phases_p50_ms"] = phases_p50(timings)
    return result


def phases_p50(timings: list[dict[str, Any]]) -> dict[str, float]:
    """The median of each phase the platform recorded (queue, setup, exec, teardown,
    total from creation to finish): where a call's latency went."""
    phases = ("queue_ms", "setup_ms", "exec_ms", "teardown_ms", "total_ms")
    out = {}
    for phase in phases:
        values = [t[phase] for t in timings if isinstance(t.get(phase), int | float)]
        if values:
            out[phase] = round(statistics.median(values), 2)
    return out


async def measure(
    url: str, key: str, args: argparse.Namespace, before: tuple[str, str] | None = None
) -> dict[str, Any]:
    levels = [int(c) for c in args.concurrency.split(",")]
    cases = [
        ("fib-c", {"n": 20}),
        ("add-wasm-python", {"a": 2, "b": 3}),
        ("add-nsjail-python", {"a": 2, "b": 3}),
    ]
    if args.only:
        cases = [case for case in cases if case[0] in args.only.split(",")]
    rows, earlier = [], []
    for name, payload in cases:
        await drive(url, key, name, payload, requests=args.warmup, concurrency=4)
        if before is not None:
            await drive(*before, name, payload, requests=args.warmup, concurrency=4)
        path = f"/v1/functions/{name}/invoke"
        for c in levels:
            if before is None:
                rows.append(
                    await drive(url, key, name, payload, requests=args.requests, concurrency=c)
                )
                continue
            now, then = await side_by_side(
                lambda n, c=c, path=path, payload=payload: load(
                    url, path, payload, _auth(key), requests=n, concurrency=c
                ),
                lambda n, c=c, path=path, payload=payload: load(
                    before[0], path, payload, _auth(before[1]), requests=n, concurrency=c
                ),
                args.requests,
            )
            row = {"function": name, "concurrency": c}
            rows.append(now | row)
            earlier.append(then | row)
    results: dict[str, Any] = {
        "benchmark": "functions",
        "cpus": os.cpu_count(),
        "node_slots": args.slots,
        "results": rows,
    }
    if before is not None:
        results["before"] = {"revision": args.compare, "results": earlier}
    return results


def start(args: argparse.Namespace, root: Path = ROOT) -> tuple[Server, str, str]:
    """A server with the three functions registered: (server, url, key)."""
    server = Server(slots=args.slots, runtimes="nsjail,wasm", root=root)
    server.wait_ready()
    url, key = server.url, server.tenant_key()
    register(
        url,
        key,
        {
            "name": "fib-c",
            "language": "wasm",
            "module_base64": fib_module(),
            "input_schema": {"type": "object"},
        },
    )
    for name, language in (("add-wasm-python", "wasm-python"), ("add-nsjail-python", "python")):
        register(
            url,
            key,
            {"name": name, "language": language, "code": PYTHON_HANDLER, "input_schema": SCHEMA},
        )
    return server, url, key


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300, help="per function and level")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--concurrency", default="1,32")
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--compare", help="also measure the server of this earlier commit")
    parser.add_argument("--only", help="these functions only (comma-separated names)")
    args = parser.parse_args()
    servers: list[Server] = []
    tree = None
    try:
        server, url, key = start(args)
        servers.append(server)
        before = None
        if args.compare:
            tree = export(args.compare)
            earlier, before_url, before_key = start(args, root=tree)
            servers.append(earlier)
            before = (before_url, before_key)
        results = asyncio.run(measure(url, key, args, before))
    finally:
        for started in servers:
            started.stop()
        if tree is not None:
            shutil.rmtree(tree, ignore_errors=True)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
