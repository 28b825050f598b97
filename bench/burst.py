"""A tenant's burst and everyone else's latency: ``/healthz`` probed through the burst.

Starts ``corral serve`` (embedded, as ``make run``: node slots derived from the machine's
memory unless ``--slots``), then, for a tenant created for the run, fires ``--requests``
``POST /v1/run`` calls (``print(1)`` in Python on nsjail) from ``--concurrency``
keep-alive clients while a thread of its own probes ``GET /healthz`` every ``--probe-ms``
on a connection of its own. Three bursts, each reported with the probe's and the burst's
latencies (p50/p99/max):

* ``new_tenant``: the tenant's first burst (its warm pool starts empty and grows);
* ``second``: the same burst again at once (its pool has grown);
* ``after_gap``: the same burst after ``--gap`` seconds idle (the pool shrinks while
  idle: ``idle_timeout_s`` of ``node/fncall/nsjail/config.py``).

With ``--url`` (and ``--admin-key``, ``--pid``) it measures a server already running,
e.g. one ``make run`` started. With ``--compare REV`` the server of that commit is
started too and each step runs on both, this tree first, then REV (the idle gap is the
same wall time for both), so a drift of the machine falls on both. Prints one JSON
document.

    .venv/bin/python bench/burst.py
    .venv/bin/python bench/burst.py --compare 95b455f
    .venv/bin/python bench/burst.py --requests 100 --concurrency 32 --runtimes nsjail \
        --code "while True: pass" --expect failed --compare 8e845a9   # runaway cases
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import secrets
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from fncall import ROOT, Server, export, process_cpu_s
from httpload import load
from stats import latency_summary


class Prober:
    """``GET /healthz`` every ``interval_s`` from a thread, on one keep-alive connection:
    the latency any other client of the server sees while the burst runs."""

    def __init__(self, url: str, interval_s: float) -> None:
        host, _, port = url.removeprefix("http://").partition(":")
        self._host, self._port = host, int(port)
        self._interval_s = interval_s
        self._stop = threading.Event()
        self.latencies_ms: list[float] = []
        self.failures = 0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Prober:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        conn = http.client.HTTPConnection(self._host, self._port, timeout=60)
        while not self._stop.is_set():
            started = time.perf_counter()
            try:
                conn.request("GET", "/healthz")
                response = conn.getresponse()
                response.read()
                ok = response.status == 200
            except (OSError, http.client.HTTPException):
                ok = False
                conn.close()
                conn = http.client.HTTPConnection(self._host, self._port, timeout=60)
            elapsed = time.perf_counter() - started
            if ok:
                self.latencies_ms.append(elapsed * 1000)
            else:
                self.failures += 1
            self._stop.wait(max(0.0, self._interval_s - elapsed))
        conn.close()


def make_run_env() -> dict[str, str]:
    """What ``scripts/run`` adds to the server: container sandboxes and a warm pool of them
    (the images from this checkout's store)."""
    return {
        "CORRAL_SANDBOX_BACKENDS": '["crun"]',
        "CORRAL_SANDBOX_WARM": '{"python": 2}',
        "CORRAL_IMAGES_DIR": str(ROOT / "var" / "images"),
    }


class Running:
    """A server started elsewhere (``make run``): its URL, admin key and, if given, the
    pid of its process (for its CPU)."""

    def __init__(self, url: str, admin_key: str, pid: int | None) -> None:
        self.url, self.admin_key, self.pid = url.rstrip("/"), admin_key, pid

    def stop(self) -> None:
        return None


def server_pid(server: Server | Running) -> int | None:
    return server.pid if isinstance(server, Running) else server.proc.pid


def create_tenant(server: Server | Running) -> str:
    """A new tenant (a fresh pool key) with room for the whole burst."""
    quota = {"max_concurrent_executions": 1024, "executions_per_second": 100_000, "burst": 100_000}
    response = httpx.post(
        f"{server.url}/v1/tenants",
        json={"name": f"burst-{secrets.token_hex(4)}", "quota": quota},
        headers={"Authorization": f"Bearer {server.admin_key}"},
        timeout=60,
    )
    response.raise_for_status()
    return str(response.json()["key"]["api_key"])


def pool_gauges(server: Server | Running) -> dict[str, float]:
    """The nsjail pool's gauges from ``/metrics`` (warm, busy, starting)."""
    text = httpx.get(f"{server.url}/metrics", timeout=60).text
    gauges: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("corral_pool_workers") and 'runtime="nsjail"' in line:
            labels, _, value = line.rpartition(" ")
            state = (
                labels.split('state="', 1)[1].split('"', 1)[0] if 'state="' in labels else labels
            )
            gauges[state] = gauges.get(state, 0.0) + float(value)
    return gauges


def burst(server: Server | Running, key: str, args: argparse.Namespace) -> dict[str, Any]:
    """One burst with the probe running; latencies, outcomes and the server's CPU."""
    body = {"language": args.language, "code": args.code}
    headers = {"Authorization": f"Bearer {key}"}
    before = pool_gauges(server)
    pid = server_pid(server)
    cpu = process_cpu_s(pid) if pid else 0.0
    with Prober(server.url, args.probe_ms / 1000) as probe:
        time.sleep(0.5)  # a few probes before the burst: the idle server's own figure
        latencies, outcomes, wall = asyncio.run(
            load(
                server.url,
                "/v1/run",
                body,
                headers,
                requests=args.requests,
                concurrency=args.concurrency,
                expected=args.expect,
            )
        )
    return {
        "healthz": latency_summary(probe.latencies_ms, errors=probe.failures),
        "burst": latency_summary(latencies, wall_s=wall, errors=args.requests - len(latencies))
        | {"statuses": outcomes, "wall_s": round(wall, 2)},
        "server_cpu_s": round(process_cpu_s(pid) - cpu, 2) if pid else None,
        "pool_before": before,
        "pool_after": pool_gauges(server),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=128)
    parser.add_argument("--language", default="python")
    parser.add_argument("--code", default="print(1)")
    parser.add_argument(
        "--expect",
        default="succeeded",
        help="the outcome whose latencies count (failed: a runaway loop's time limit)",
    )
    parser.add_argument("--probe-ms", type=float, default=50.0)
    parser.add_argument("--gap", type=float, default=60.0, help="idle seconds before burst 3")
    parser.add_argument("--slots", type=int, default=0, help="node slots (0: derived)")
    parser.add_argument("--runtimes", default="nsjail,wasm", help="backends of the server")
    parser.add_argument(
        "--make-run",
        action="store_true",
        help="also start what make run starts: crun sandboxes, two warm python ones",
    )
    parser.add_argument("--compare", help="also measure the server of this earlier commit")
    parser.add_argument("--url", help="a running server (make run) instead of starting one")
    parser.add_argument("--admin-key", default=os.environ.get("CORRAL_ADMIN_KEY"))
    parser.add_argument("--pid", type=int, help="the running server's pid, for its CPU")
    args = parser.parse_args()
    env = make_run_env() if args.make_run else {}
    servers: dict[str, Server | Running] = {}
    tree: Path | None = None
    try:
        if args.url:
            servers["after"] = Running(args.url, args.admin_key, args.pid)
        else:
            servers["after"] = Server(args.slots, args.runtimes, env=env)
        if args.compare:
            tree = export(args.compare)
            servers["before"] = Server(args.slots, args.runtimes, root=tree, env=env)
        for server in servers.values():
            if isinstance(server, Server):
                server.wait_ready()
        keys = {name: create_tenant(server) for name, server in servers.items()}
        steps: dict[str, dict[str, Any]] = {name: {} for name in servers}
        for step in ("new_tenant", "second", "after_gap"):
            if step == "after_gap":
                time.sleep(args.gap)
            for name, server in servers.items():
                steps[name][step] = burst(server, keys[name], args)
                if step != "after_gap":
                    time.sleep(2)  # let the other server's jails settle
        results: dict[str, Any] = {
            "benchmark": "burst",
            "requests": args.requests,
            "concurrency": args.concurrency,
            "probe_ms": args.probe_ms,
            "gap_s": args.gap,
            "node_slots": args.slots or "derived",
            "corral": steps["after"],
        }
        if args.compare:
            results["before"] = {"revision": args.compare, **steps["before"]}
    finally:
        for server in servers.values():
            server.stop()
        if tree is not None:
            shutil.rmtree(tree, ignore_errors=True)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
