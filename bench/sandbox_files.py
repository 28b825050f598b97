"""Sandbox file calls through the API: a small file's round trip, a 64 MiB read, a large
file's upload and download.

Starts ``corral serve`` (embedded; crun; the ``python`` image from var/images) and
measures, as a client sees them:

* a small file (``--small-bytes``, 100) written then read back (``PUT`` then ``GET
  .../files``), each call timed, ``--calls`` times; and ``stat`` of it;
* ``--reads`` reads of a 64 MiB file of random bytes (``GET .../files``, streamed, the
  client discarding what it gets): the time of each and the server's resident memory at
  its highest during them, over its resident memory before (sampled from
  ``/proc/<pid>/status`` every 5 ms);
* with ``--large-mib N``: a file of N MiB uploaded (``PUT``, streamed from the client in
  1 MiB chunks made as they are sent, no Content-Length) then downloaded (``GET``,
  streamed, discarded), by this tree's server only: MB/s (10^6 bytes per second) of each
  and the server's peak resident memory growth during each. The baseline in the same run
  is the sandbox's own disk: the same size written inside the sandbox (``head -c N
  /dev/zero > f``) and read back (``cat f > /dev/null``), timed by its ``exec``. (Before
  this, an upload over 8 MiB was refused: no earlier commit can be measured.)

With ``--compare REV`` the server of an earlier commit runs beside this tree's and both
are measured in four halves, after-before-before-after, so that a drift of the machine
falls on both (the earlier server uses this tree's ``corral-init``, which still speaks
the command protocol it knows). Prints one JSON document.

    .venv/bin/python bench/sandbox_files.py --calls 300 --reads 6 --compare HEAD~3
    .venv/bin/python bench/sandbox_files.py --calls 20 --reads 2 --large-mib 2048
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

from fncall import ROOT, export
from sandboxes import IMAGES, Api, SandboxServer
from stats import latency_summary

BIG_BYTES = 64 << 20
#: a large upload's chunk, as the client sends it
LARGE_CHUNK = 1 << 20


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


class Peak:
    """The highest resident memory of process ``pid`` while the block runs."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.before = self.peak = rss_kib(pid)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._done.wait(0.005):
            self.peak = max(self.peak, rss_kib(self.pid))

    def __enter__(self) -> Peak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()


class Side:
    """One server, its tenant and its sandbox."""

    def __init__(self, server: SandboxServer) -> None:
        self.server = server
        self.api = Api(server.url, server.tenant_key(max_concurrent_sandboxes=100))
        self.one = ""
        self.samples: dict[str, list[float]] = {"write": [], "read": [], "stat": [], "big": []}
        self.rss_growth_mib: list[float] = []

    async def start(self) -> None:
        sandbox_id = await self.api.create(memory_mb=512, disk_mb=256)
        self.one = f"/v1/sandboxes/{sandbox_id}"
        await self.api.exec(sandbox_id, ["sh", "-c", f"head -c {BIG_BYTES} /dev/urandom >/tmp/big"])

    async def small(self, calls: int, data: bytes) -> None:
        params = {"path": "/home/user/small.txt"}
        for _ in range(calls):
            t0 = time.perf_counter()
            put = await self.api.request("PUT", f"{self.one}/files", params=params, content=data)
            t1 = time.perf_counter()
            got = await self.api.request("GET", f"{self.one}/files", params=params)
            t2 = time.perf_counter()
            stat = await self.api.request("GET", f"{self.one}/files/stat", params=params)
            t3 = time.perf_counter()
            if put.status_code != 200 or got.content != data or stat.status_code != 200:
                raise RuntimeError(f"small round trip failed: {put.text} {got.status_code}")
            self.samples["write"].append((t1 - t0) * 1000)
            self.samples["read"].append((t2 - t1) * 1000)
            self.samples["stat"].append((t3 - t2) * 1000)

    async def big(self, reads: int) -> None:
        for _ in range(reads):
            total = 0
            with Peak(self.server.proc.pid) as peak:
                t0 = time.perf_counter()
                async with self.api.http.stream(
                    "GET", f"{self.one}/files", params={"path": "/tmp/big"}
                ) as answer:
                    async for chunk in answer.aiter_raw():
                        total += len(chunk)
                elapsed = time.perf_counter() - t0
            if total != BIG_BYTES:
                raise RuntimeError(f"the 64 MiB read gave {total} bytes")
            self.samples["big"].append(elapsed * 1000)
            self.rss_growth_mib.append(round((peak.peak - peak.before) / 1024, 1))

    async def large(self, mib: int) -> dict[str, Any]:
        """One upload and one download of ``mib`` MiB, and the sandbox's own disk."""
        sandbox_id = await self.api.create(memory_mb=mib + 512, disk_mb=mib + 512)
        one, size = f"/v1/sandboxes/{sandbox_id}", mib << 20
        block = bytes(range(256)) * (LARGE_CHUNK // 256)

        async def body() -> Any:
            for _ in range(mib):
                yield block

        params = {"path": "/home/user/large.bin"}
        try:
            with Peak(self.server.proc.pid) as up:
                t0 = time.perf_counter()
                put = await self.api.request("PUT", f"{one}/files", params=params, content=body())
                upload_s = time.perf_counter() - t0
            if put.status_code != 200 or put.json()["size"] != size:
                raise RuntimeError(f"the large upload failed: {put.status_code} {put.text}")
            total = 0
            with Peak(self.server.proc.pid) as down:
                t0 = time.perf_counter()
                async with self.api.http.stream("GET", f"{one}/files", params=params) as answer:
                    async for chunk in answer.aiter_raw():
                        total += len(chunk)
                download_s = time.perf_counter() - t0
            if total != size:
                raise RuntimeError(f"the large download gave {total} bytes")
            script = (
                "rm -f /home/user/large.bin; s=$(date +%s%N); "
                f"head -c {size} /dev/zero > /home/user/disk.bin; m=$(date +%s%N); "
                "cat /home/user/disk.bin > /dev/null; e=$(date +%s%N); echo $s $m $e"
            )
            ran = await self.api.exec(sandbox_id, ["sh", "-c", script])
            start, middle, end = (int(x) for x in ran["stdout"].split())
        finally:
            await self.api.destroy(sandbox_id)

        def rate(seconds: float) -> float:
            return round(size / seconds / 1e6, 1)

        return {
            "mib": mib,
            "upload_mb_per_s": rate(upload_s),
            "upload_server_rss_growth_mib": round((up.peak - up.before) / 1024, 1),
            "download_mb_per_s": rate(download_s),
            "download_server_rss_growth_mib": round((down.peak - down.before) / 1024, 1),
            "baseline_in_sandbox_write_mb_per_s": rate((middle - start) / 1e9),
            "baseline_in_sandbox_read_mb_per_s": rate((end - middle) / 1e9),
        }

    def summary(self) -> dict[str, Any]:
        round_trips = [
            w + r for w, r in zip(self.samples["write"], self.samples["read"], strict=True)
        ]
        big = self.samples["big"]
        return {
            "small_write_read_round_trip": latency_summary(round_trips),
            "small_write": latency_summary(self.samples["write"]),
            "small_read": latency_summary(self.samples["read"]),
            "small_stat": latency_summary(self.samples["stat"]),
            "read_64mib": latency_summary(big)
            | {"mib_per_s_median": round(64 / (sorted(big)[len(big) // 2] / 1000), 1)},
            "read_64mib_server_rss_growth_mib": self.rss_growth_mib,
        }


def serve(root: Path = ROOT) -> SandboxServer:
    env = {
        "CORRAL_SANDBOX_BACKENDS": '["crun"]',
        "CORRAL_IMAGES_DIR": str(IMAGES),
        "CORRAL_RUNTIMES": '["nsjail"]',
        "CORRAL_SANDBOX_WARM": "{}",
    }
    server = SandboxServer(2, "nsjail", env=env, root=root)
    server.wait_ready()
    return server


async def measure(sides: dict[str, Side], args: argparse.Namespace) -> dict[str, Any]:
    data = b"s" * args.small_bytes
    for side in sides.values():
        await side.start()
        await side.small(10, data)  # warm-up, not counted
        for samples in side.samples.values():
            samples.clear()
    order = ["after", "before", "before", "after"] if len(sides) == 2 else ["after", "after"]
    for name in order:
        await sides[name].small(args.calls // 2, data)
    for name in order:
        await sides[name].big(max(1, args.reads // 2))
    large = await sides["after"].large(args.large_mib) if args.large_mib else None
    for side in sides.values():
        await side.api.destroy(side.one.rsplit("/", 1)[1])
        await side.api.http.aclose()
    result = {name: side.summary() for name, side in sides.items()}
    if large is not None:
        result["after"]["large"] = large
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300, help="small round trips per server")
    parser.add_argument("--small-bytes", type=int, default=100)
    parser.add_argument("--reads", type=int, default=6, help="64 MiB reads per server")
    parser.add_argument("--compare", help="also measure the server of this earlier commit")
    parser.add_argument(
        "--large-mib", type=int, default=0, help="also upload and download a file this large"
    )
    args = parser.parse_args()
    if not (IMAGES / "names" / "python").exists():
        sys.exit("build the python image first: bash scripts/setup-images.sh")
    servers: dict[str, SandboxServer] = {}
    tree = None
    try:
        servers["after"] = serve()
        if args.compare:
            tree = export(args.compare)
            (tree / "var").symlink_to(ROOT / "var")  # the same images and guest binaries
            guest = "node/sandboxes/guest/bin"  # built here, not in git
            at = guest if (tree / "node").is_dir() else Path("deploy", "sandbox", "bin")
            shutil.copytree(ROOT / guest, tree / at, dirs_exist_ok=True)
            servers["before"] = serve(tree)
        sides = {name: Side(server) for name, server in servers.items()}
        result: dict[str, Any] = asyncio.run(measure(sides, args))
        if args.compare:
            result["before"] = {"revision": args.compare, **result["before"]}
    except BaseException:
        for server in servers.values():
            log = server.dir / "server.log"
            sys.stderr.write(log.read_text(errors="replace")[-5_000:] if log.exists() else "")
        raise
    finally:
        for server in servers.values():
            server.stop_and_release()
        if tree is not None:
            shutil.rmtree(tree, ignore_errors=True)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
