"""Sandbox benchmark: create-to-first-exec, exec, creates per second, a burst, density.

Starts ``corral serve`` (embedded; crun; the ``python`` image from var/images) unless
``--url`` names a running server, and measures through the API, as a client sees it:

* cold create-to-first-exec latency (``POST /v1/sandboxes`` then ``exec true``), p50/p90;
* exec latency of ``true`` in a running sandbox, through the API and through the ``e2b``
  SDK's ``commands.run``;
* creates per second at concurrency 8 (each sandbox destroyed after its first exec);
* a burst of ``--burst`` creates at once: all ready, time to the last;
* memory per idle sandbox and how many idle sandboxes the machine holds: ``--hold`` idle
  sandboxes are created, and the host's available memory before and after gives the
  cost of each (page cache of the shared image is counted once, as it is).

Baseline in the same run: the OCI runtime itself on the same image without Corral
(``crun run -d`` of a prepared bundle, ``crun exec true``, ``crun delete -f``), so the
ratio says what the platform adds. Prints one JSON document.

    .venv/bin/python bench/sandboxes.py --creates 40 --execs 200 --burst 200 --hold 2000

With ``--compare REV`` it also starts this tree's server and the server of an earlier
commit side by side and measures exec through the API and through the SDK, and cold
create-to-first-exec and create-exec-destroy cycles per second at ``--concurrency``, on
both, in alternating halves (``exec_compare``, ``create_compare``, ``cycles_compare``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from fncall import ROOT, Server, export
from stats import latency_summary

IMAGES = ROOT / "var" / "images"


def release(data_dir: Path) -> None:
    """Destroy what a stopped server left (a node leaves its sandboxes running for its
    next start to adopt; a benchmark's server has no next start)."""
    state = data_dir / "sandboxes" / ".state"
    crun = shutil.which("crun")
    if crun and state.is_dir():
        listed = subprocess.run([crun, "--root", str(state), "list", "-q"], capture_output=True)
        for container in listed.stdout.decode().split():
            subprocess.run([crun, "--root", str(state), "delete", "-f", container], check=False)
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f if str(data_dir) in line.split()[4]]
    for point in sorted(points, reverse=True):
        subprocess.run(["umount", "-l", point], check=False)
    shutil.rmtree(data_dir / "sandboxes", ignore_errors=True)
    with contextlib.suppress(ImportError, OSError):  # an earlier commit's tree has no ranges
        from node.sandboxes.crun.uidranges import UidRanges

        UidRanges().reclaim()  # the id ranges its sandboxes held (their dirs are gone)


class SandboxServer(Server):
    def stop_and_release(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        release(self.dir)
        self.stop()


def meminfo_available_mb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no MemAvailable")


class Api:
    def __init__(self, url: str, key: str) -> None:
        self.http = httpx.AsyncClient(
            base_url=url,
            headers={"Authorization": f"Bearer {key}"},
            timeout=120,
            limits=httpx.Limits(max_connections=256),
        )
        self.timings: list[dict[str, float]] = []  #: each create's record phases

    async def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """The request, sent again if a kept-alive connection was closed under it (the
        server closes idle connections after 5 s; a burst's later requests meet that)."""
        for attempt in range(3):
            try:
                return await self.http.request(method, path, **kwargs)
            except (httpx.ReadError, httpx.RemoteProtocolError, httpx.WriteError):
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    async def create(self, **body: Any) -> str:
        for _ in range(600):
            response = await self.request("POST", "/v1/sandboxes", json={"image": "python", **body})
            if response.status_code != 503:
                break
            await asyncio.sleep(0.1)
        response.raise_for_status()
        body = response.json()
        self.timings.append(body["timings"])
        return str(body["id"])

    async def exec(self, sandbox_id: str, cmd: list[str]) -> dict[str, Any]:
        response = await self.request("POST", f"/v1/sandboxes/{sandbox_id}/exec", json={"cmd": cmd})
        if response.status_code != 200:
            record = (await self.request("GET", f"/v1/sandboxes/{sandbox_id}")).text
            raise RuntimeError(f"exec {response.status_code} {response.text}; record: {record}")
        result: dict[str, Any] = response.json()
        if result["exit_code"] != 0:
            raise RuntimeError(f"exec failed: {result}")
        return result

    async def destroy(self, sandbox_id: str) -> None:
        (await self.request("DELETE", f"/v1/sandboxes/{sandbox_id}")).raise_for_status()


def phases(api: Api, created: list[float], first_exec: list[float]) -> dict[str, float]:
    """Medians: the create's round trip, its record's phases, then its first exec."""
    recent = api.timings[-len(created) :]
    out = {"create_answered_ms": statistics.median(created)}
    for name in ("queue_ms", "image_ms", "setup_ms", "start_ms"):
        out[name] = statistics.median(t[name] or 0.0 for t in recent)
    out["first_exec_ms"] = statistics.median(first_exec)
    return {k: round(v, 1) for k, v in out.items()}


async def create_to_first_exec(api: Api, n: int, pause_s: float = 0.0) -> dict[str, Any]:
    samples: list[float] = []
    created: list[float] = []
    first_exec: list[float] = []
    for _ in range(n):
        t0 = time.perf_counter()
        sandbox_id = await api.create(memory_mb=256)
        t1 = time.perf_counter()
        await api.exec(sandbox_id, ["true"])
        t2 = time.perf_counter()
        samples.append((t2 - t0) * 1000)
        created.append((t1 - t0) * 1000)
        first_exec.append((t2 - t1) * 1000)
        await api.destroy(sandbox_id)
        if pause_s:
            await asyncio.sleep(pause_s)  # a trainer's pace: a pool refills between creates
    out = latency_summary(samples, wall_s=sum(samples) / 1000, errors=0)
    out["phases"] = phases(api, created, first_exec)
    return out


async def exec_latency(api: Api, n: int) -> dict[str, Any]:
    sandbox_id = await api.create(memory_mb=256)
    samples: list[float] = []
    started = time.perf_counter()
    try:
        for _ in range(n):
            t0 = time.perf_counter()
            await api.exec(sandbox_id, ["true"])
            samples.append((time.perf_counter() - t0) * 1000)
    finally:
        await api.destroy(sandbox_id)
    return latency_summary(samples, wall_s=time.perf_counter() - started, errors=0)


class E2BSession:
    """One sandbox made through the unchanged ``e2b`` SDK, for ``commands.run("true")``."""

    def __init__(self, url: str, key: str) -> None:
        from e2b import Sandbox

        os.environ.update(E2B_API_URL=url, E2B_SANDBOX_URL=url, E2B_API_KEY=key)
        self.sandbox = Sandbox.create(template="python", timeout=300)

    def run(self, n: int) -> tuple[list[float], float]:
        samples: list[float] = []
        started = time.perf_counter()
        for _ in range(n):
            t0 = time.perf_counter()
            self.sandbox.commands.run("true")
            samples.append((time.perf_counter() - t0) * 1000)
        return samples, time.perf_counter() - started

    def close(self) -> None:
        self.sandbox.kill()


def e2b_exec_latency(url: str, key: str, n: int) -> dict[str, Any]:
    """``commands.run("true")`` through the unchanged ``e2b`` SDK (issue 10's row)."""
    session = E2BSession(url, key)
    try:
        samples, wall = session.run(n)
    finally:
        session.close()
    return latency_summary(samples, wall_s=wall, errors=0)


async def exec_compare(sides: dict[str, tuple[str, str]], n: int) -> dict[str, Any]:
    """``exec true`` through the API and ``commands.run("true")`` through the SDK on two
    servers (``after``, ``before``), in four halves after-before-before-after, so that a
    drift of the machine falls on both."""
    apis = {side: Api(url, key) for side, (url, key) in sides.items()}
    ids = {side: await api.create(memory_mb=256) for side, api in apis.items()}
    sdks = {
        side: await asyncio.to_thread(E2BSession, url, key) for side, (url, key) in sides.items()
    }
    samples: dict[str, dict[str, list[float]]] = {s: {"api": [], "sdk": []} for s in sides}
    walls: dict[str, dict[str, float]] = {s: {"api": 0.0, "sdk": 0.0} for s in sides}
    try:
        for side in ("after", "before", "before", "after"):
            started = time.perf_counter()
            for _ in range(n // 2):
                t0 = time.perf_counter()
                await apis[side].exec(ids[side], ["true"])
                samples[side]["api"].append((time.perf_counter() - t0) * 1000)
            walls[side]["api"] += time.perf_counter() - started
            sdk_samples, wall = await asyncio.to_thread(sdks[side].run, n // 2)
            samples[side]["sdk"].extend(sdk_samples)
            walls[side]["sdk"] += wall
    finally:
        for side, api in apis.items():
            await asyncio.to_thread(sdks[side].close)
            await api.destroy(ids[side])
            await api.http.aclose()
    return {
        side: {
            f"exec_true{'' if kind == 'api' else '_e2b_sdk'}": latency_summary(
                samples[side][kind], wall_s=walls[side][kind], errors=0
            )
            for kind in ("api", "sdk")
        }
        for side in sides
    }


async def create_compare(
    sides: dict[str, tuple[str, str]], n: int, pause_s: float = 0.0
) -> dict[str, Any]:
    """Create-to-first-exec on two servers, in four halves after-before-before-after, as
    ``exec_compare`` (``pause_s`` between creates: a pool's refill)."""
    apis = {side: Api(url, key) for side, (url, key) in sides.items()}
    samples: dict[str, list[float]] = {side: [] for side in sides}
    try:
        for side in ("after", "before", "before", "after"):
            for _ in range(n // 2):
                t0 = time.perf_counter()
                sandbox_id = await apis[side].create(memory_mb=256)
                await apis[side].exec(sandbox_id, ["true"])
                samples[side].append((time.perf_counter() - t0) * 1000)
                await apis[side].destroy(sandbox_id)
                if pause_s:
                    await asyncio.sleep(pause_s)
    finally:
        for api in apis.values():
            await api.http.aclose()
    out = {}
    for side, values in samples.items():
        out[side] = latency_summary(values, wall_s=sum(values) / 1000, errors=0)
        timings = apis[side].timings
        out[side]["phases"] = {
            name: round(statistics.median(t[name] or 0.0 for t in timings), 1)
            for name in ("queue_ms", "image_ms", "setup_ms", "start_ms")
        }
    return out


async def cycles_compare(
    sides: dict[str, tuple[str, str]], n: int, concurrency: int
) -> dict[str, Any]:
    """Create-exec-destroy cycles per second at ``concurrency`` on two servers, in four
    halves after-before-before-after (as ``exec_compare``), each half ``n // 2`` cycles."""
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    for side in ("after", "before", "before", "after"):
        api = Api(*sides[side])
        try:
            runs[side].append(await creates_per_second(api, n // 2, concurrency))
        finally:
            await api.http.aclose()
    return {
        side: {
            "cycles_per_s": round(statistics.mean(r["creates_per_s"] for r in halves), 1),
            "p50_ms": round(statistics.mean(r["p50_ms"] for r in halves), 1),
            "halves": [r["creates_per_s"] for r in halves],
        }
        for side, halves in runs.items()
    }


async def creates_per_second(api: Api, n: int, concurrency: int) -> dict[str, Any]:
    queue = list(range(n))
    samples: list[float] = []

    async def worker() -> None:
        while queue:
            queue.pop()
            t0 = time.perf_counter()
            sandbox_id = await api.create(memory_mb=256)
            await api.exec(sandbox_id, ["true"])
            samples.append((time.perf_counter() - t0) * 1000)
            await api.destroy(sandbox_id)

    started, cpu = time.perf_counter(), machine_cpu_s()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall, cpu = time.perf_counter() - started, machine_cpu_s() - cpu
    out = latency_summary(samples, wall_s=wall, errors=0)
    out["creates_per_s"] = round(n / wall, 1)
    out["machine_cpu_ms_per_cycle"] = round(cpu * 1000 / n, 1)  # the client's included
    return out


def machine_cpu_s() -> float:
    """CPU seconds the whole machine has spent busy since boot (``/proc/stat``)."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


async def fill_history(api: Api, n: int) -> None:
    """``n`` sandboxes created, run once and destroyed, 8 at a time: the history a server
    has after a while of use (its tables, its node's state), before anything is timed."""
    if n:
        await creates_per_second(api, n, 8)


async def fill_history_at(url: str, key: str, n: int) -> None:
    api = Api(url, key)
    try:
        await fill_history(api, n)
    finally:
        await api.http.aclose()


async def burst(api: Api, n: int) -> dict[str, Any]:
    started = time.perf_counter()
    ready: list[float] = []

    async def one() -> str:
        sandbox_id = await api.create(memory_mb=256)
        await api.exec(sandbox_id, ["true"])
        ready.append(time.perf_counter() - started)
        return sandbox_id

    ids = await asyncio.gather(*(one() for _ in range(n)))
    last = time.perf_counter() - started
    await asyncio.gather(*(api.destroy(i) for i in ids))
    return {
        "sandboxes": n,
        "all_ready": len(ready) == n,
        "time_to_last_s": round(last, 2),
        "time_to_half_s": round(sorted(ready)[n // 2 - 1], 2),
    }


async def density(api: Api, n: int, concurrency: int = 8) -> dict[str, Any]:
    await asyncio.sleep(2)
    before = meminfo_available_mb()
    ids: list[str] = []
    started = time.perf_counter()

    async def worker(count: int) -> None:
        for _ in range(count):
            ids.append(await api.create(memory_mb=256, ttl_s=3600))

    share = [n // concurrency + (1 if i < n % concurrency else 0) for i in range(concurrency)]
    await asyncio.gather(*(worker(c) for c in share))
    created_s = time.perf_counter() - started
    await asyncio.sleep(5)  # let the kernel settle its lazy frees
    after = meminfo_available_mb()
    probe = await api.exec(ids[len(ids) // 2], ["python3", "-c", "print(6*7)"])
    per_mb = (before - after) / n
    total_mb = before + (before - after)  # available when none were held, roughly
    cleanup = time.perf_counter()
    for i in range(0, len(ids), 64):
        await asyncio.gather(*(api.destroy(s) for s in ids[i : i + 64]))
    return {
        "held_idle": n,
        "created_in_s": round(created_s, 1),
        "memory_per_idle_mb": round(per_mb, 2),
        "available_before_mb": round(before),
        "available_while_held_mb": round(after),
        "one_of_them_still_runs_python": probe["stdout"].strip() == "42",
        "idle_sandboxes_in_24_gib_estimate": int(24 * 1024 / per_mb) if per_mb > 0 else None,
        "of_this_machine_estimate": int(total_mb / per_mb) if per_mb > 0 else None,
        "destroyed_in_s": round(time.perf_counter() - cleanup, 1),
    }


# --- baseline: the OCI runtime alone -----------------------------------------------------------
def baseline(rootfs: Path, n: int) -> dict[str, Any]:
    """``crun run -d`` + ``crun exec true`` + ``crun delete -f`` of a bundle over the same
    image rootfs (read-only, no overlay, no cgroup limits written by Corral)."""
    crun = shutil.which("crun")
    if crun is None:
        return {"skipped": "crun is not installed"}
    work = Path(tempfile.mkdtemp(prefix="corral-bench-crun-"))
    state = work / "state"
    try:
        subprocess.run([crun, "spec"], cwd=work, check=True)
        config = json.loads((work / "config.json").read_text())
        config["process"]["terminal"] = False
        config["process"]["args"] = ["sleep", "3600"]
        config["root"] = {"path": str(rootfs), "readonly": True}
        (work / "config.json").write_text(json.dumps(config))
        create, execs = [], []
        for i in range(n):
            name = f"bench-{i}"
            t0 = time.perf_counter()
            subprocess.run(
                [crun, "--root", str(state), "run", "-d", "--bundle", str(work), name],
                check=True,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            t1 = time.perf_counter()
            subprocess.run([crun, "--root", str(state), "exec", name, "true"], check=True)
            t2 = time.perf_counter()
            subprocess.run([crun, "--root", str(state), "delete", "-f", name], check=True)
            create.append((t2 - t0) * 1000)
            execs.append((t2 - t1) * 1000)
        return {
            "create_to_first_exec": latency_summary(create, wall_s=sum(create) / 1000, errors=0),
            "exec": latency_summary(execs, wall_s=sum(execs) / 1000, errors=0),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


def bench_key(server: SandboxServer) -> str:
    """A tenant key whose quotas do not bind the benchmark (its sandbox calls included,
    on a server that has that quota; an earlier commit's refuses the field)."""
    unbound = {
        "sandbox_calls_per_second": 1_000_000,
        "sandbox_call_burst": 1_000_000,
        "max_sandboxes_memory_mb": 100_000_000,
        "max_sandboxes_cpu": 1_000_000,
        "max_sandboxes_disk_mb": 1_000_000_000,
    }
    try:
        return server.tenant_key(max_concurrent_sandboxes=100_000, **unbound)
    except httpx.HTTPStatusError as exc:
        if exc.response.status_code != 422:
            raise
        return server.tenant_key(max_concurrent_sandboxes=100_000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url")
    parser.add_argument("--key")
    parser.add_argument("--creates", type=int, default=40)
    parser.add_argument("--execs", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--burst", type=int, default=200)
    parser.add_argument("--hold", type=int, default=500)
    parser.add_argument("--warm", type=int, default=8, help="warm python sandboxes (pool run)")
    parser.add_argument(
        "--compare",
        help="also measure exec (API and SDK) against the server of this earlier commit",
    )
    parser.add_argument(
        "--compare-warm",
        type=int,
        default=0,
        help="warm python sandboxes of both --compare servers (their creates then claim)",
    )
    parser.add_argument(
        "--history",
        type=int,
        default=0,
        help="create and destroy this many sandboxes on each server before measuring "
        "(a server with a long history, as users run it)",
    )
    args = parser.parse_args()

    if not args.url and not (IMAGES / "names" / "python").exists():
        sys.exit("build the python image first: bash scripts/setup-images.sh")
    result: dict[str, Any] = {}

    def serve(warm: int, root: Path = ROOT) -> SandboxServer:
        env = {
            "CORRAL_SANDBOX_BACKENDS": '["crun"]',
            "CORRAL_IMAGES_DIR": str(IMAGES),
            "CORRAL_RUNTIMES": '["nsjail"]',
            "CORRAL_SANDBOX_WARM": json.dumps({"python": warm} if warm else {}),
            # the density run measures what the machine holds, not the node's budget
            "CORRAL_SANDBOX_MEMORY_MB": str(1 << 30),
            "CORRAL_SANDBOX_CPU": str(1 << 20),
        }
        server = SandboxServer(8, "nsjail", env=env, root=root)
        server.wait_ready()
        return server

    async def cold_suite(url: str, key: str) -> None:
        api = Api(url, key)
        await fill_history(api, args.history)
        result["create_to_first_exec_cold"] = await create_to_first_exec(api, args.creates)
        result["exec_true"] = await exec_latency(api, args.execs)
        result["exec_true_e2b_sdk"] = await asyncio.to_thread(
            e2b_exec_latency, url, key, args.execs
        )
        result[f"creates_at_concurrency_{args.concurrency}_cold"] = await creates_per_second(
            api, args.creates * 2, args.concurrency
        )
        if args.burst:
            result["burst_cold"] = await burst(api, args.burst)
        if args.hold:
            result["density"] = await density(api, args.hold)
        await api.http.aclose()

    async def pool_suite(url: str, key: str) -> None:
        api = Api(url, key)
        await fill_history(api, args.history)
        await asyncio.sleep(3)  # the pool warms up
        result["create_to_first_exec_pool"] = await create_to_first_exec(
            api, args.creates, pause_s=0.3
        )
        result[f"creates_at_concurrency_{args.concurrency}_pool"] = await creates_per_second(
            api, args.creates * 2, args.concurrency
        )
        await api.http.aclose()

    if args.url:
        asyncio.run(cold_suite(args.url, args.key))
    else:
        for warm, suite in ((0, cold_suite), (args.warm, pool_suite)):
            if warm == 0 and suite is pool_suite:
                continue
            server = serve(warm)
            try:
                asyncio.run(suite(server.url, bench_key(server)))
            except BaseException:
                log = server.dir / "server.log"
                sys.stderr.write(log.read_text(errors="replace")[-20_000:] if log.exists() else "")
                raise
            finally:
                server.stop_and_release()
    if args.compare and not args.url:
        tree = export(args.compare)
        (tree / "var").symlink_to(ROOT / "var")  # the same images and guest binaries
        guest = "node/sandboxes/guest/bin"  # built here, not in git
        at = guest if (tree / "node").is_dir() else Path("deploy", "sandbox", "bin")
        shutil.copytree(ROOT / guest, tree / at, dirs_exist_ok=True)
        warm = args.compare_warm
        servers = {"after": serve(warm), "before": serve(warm, tree)}
        try:
            sides = {side: (s.url, bench_key(s)) for side, s in servers.items()}
            for url, key in sides.values():
                asyncio.run(fill_history_at(url, key, args.history))
            compared = asyncio.run(exec_compare(sides, args.execs))
            result["exec_compare"] = {"revision": args.compare, **compared}
            if warm:
                time.sleep(3)  # the pools warm up
            created = asyncio.run(create_compare(sides, args.creates, 0.3 if warm else 0.0))
            kind = "pool" if warm else "cold"
            result[f"create_to_first_exec_{kind}_compare"] = {"revision": args.compare, **created}
            cycles = asyncio.run(cycles_compare(sides, args.creates * 2, args.concurrency))
            result[f"cycles_at_concurrency_{args.concurrency}_{kind}_compare"] = {
                "revision": args.compare,
                **cycles,
            }
        finally:
            for server in servers.values():
                server.stop_and_release()
            shutil.rmtree(tree, ignore_errors=True)
    image = json.loads((IMAGES / "names" / "python").read_text())["digest"].split(":")[1]
    result["baseline_crun_alone"] = baseline(IMAGES / image / "rootfs", min(args.creates, 40))
    base = result["baseline_crun_alone"]
    if "exec" in base:
        result["ratio_exec_p50"] = round(result["exec_true"]["p50_ms"] / base["exec"]["p50_ms"], 2)
        result["ratio_create_cold_p50"] = round(
            result["create_to_first_exec_cold"]["p50_ms"] / base["create_to_first_exec"]["p50_ms"],
            2,
        )
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
