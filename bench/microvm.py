"""MicroVM sandboxes on this node's backend (``node.sandboxes.microvm``), as the node's
manager drives it (no HTTP: the API adds its few milliseconds on top):

* the cold path, the baseline in the same run: the image's template made from a cold boot
  (QEMU booted, the agent answering, the disk grown, the state saved);
* restore to first exec: ``--creates`` sandboxes, one after another, each restored from
  the template then ``true`` run in it; then ``--concurrent`` created at once (each
  create's own latency);
* exec: ``--execs`` runs of ``true`` in one running VM;
* warm claims: ``--creates`` clones restored and paused ahead (as the node's warm pool
  keeps them), each claimed by a create of its shape (``MicrovmBackend.claim``: QEMU goes
  on, a HELLO with the sandbox's identity) then ``true`` run in it; then ``--concurrent``
  claimed at once;
* fork: a snapshot of a running VM (its whole machine: memory, disk, processes) and
  ``--concurrent`` sandboxes made from it at once, each to its first exec;
* memory: ``--hold`` idle VMs held at once, each's cost as the host sees it (QEMU's PSS,
  its share of the template's pages counted once), and the node's available memory
  before and after (MemAvailable) over the VMs held: what one more idle VM takes.

The accelerator (``kvm`` or ``tcg``) is named in the output. The image is the ``python``
image from var/images. Prints one JSON document.

    .venv/bin/python bench/microvm.py --creates 20 --concurrent 8 --execs 200 --hold 50
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.stats import latency_summary  # noqa: E402
from node.sandboxes.microvm.backend import MicrovmBackend  # noqa: E402
from node.sandboxes.service import image_store_resolver  # noqa: E402
from wire.sandboxes import ExecExit, ExecRequest, SandboxSpec  # noqa: E402


def mem_available_mib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no MemAvailable")


async def run_true(backend: MicrovmBackend, sandbox_id: str) -> None:
    process = await backend.exec(sandbox_id, ExecRequest(cmd=["true"]), default_user="user")
    async for event in process.events():
        if isinstance(event, ExecExit) and event.exit_code != 0:
            raise RuntimeError(f"true exited {event.exit_code}")


def spec(sandbox_id: str, memory_mb: int) -> SandboxSpec:
    return SandboxSpec(
        sandbox_id=sandbox_id, tenant_id="bench", backend="microvm", image="python",
        memory_mb=memory_mb, disk_mb=256,
    )  # fmt: skip


async def main(args: argparse.Namespace) -> dict[str, Any]:
    image = image_store_resolver(ROOT / "var" / "images")("python")
    root = Path(tempfile.mkdtemp(prefix="corral-bench-microvm-"))
    root.chmod(0o755)  # noqa: ASYNC240  (once, before anything runs)
    backend = MicrovmBackend(root, accelerator=args.accelerator)
    made: list[str] = []
    out: dict[str, Any] = {}
    try:
        await backend.start()
        out["accelerator"] = backend.accelerator
        started = time.monotonic()
        await backend.create(spec("cold", args.memory_mb), image)
        made.append("cold")
        await run_true(backend, "cold")
        out["cold_template_and_first_exec_s"] = round(time.monotonic() - started, 3)

        restores: list[float] = []
        for n in range(args.creates):
            sandbox_id = f"seq{n}"
            t = time.monotonic()
            await backend.create(spec(sandbox_id, args.memory_mb), image)
            made.append(sandbox_id)
            await run_true(backend, sandbox_id)
            restores.append((time.monotonic() - t) * 1000)
        out["restore_to_first_exec_ms"] = latency_summary(restores)

        execs: list[float] = []
        for _ in range(args.execs):
            t = time.monotonic()
            await run_true(backend, "cold")
            execs.append((time.monotonic() - t) * 1000)
        out["exec_true_ms"] = latency_summary(execs)

        async def one(n: int) -> float:
            t = time.monotonic()
            await backend.create(spec(f"con{n}", args.memory_mb), image)
            made.append(f"con{n}")
            await run_true(backend, f"con{n}")
            return (time.monotonic() - t) * 1000

        each = await asyncio.gather(*(one(n) for n in range(args.concurrent)))
        out["concurrent_creates"] = {
            "count": args.concurrent,
            "each_ms": sorted(round(v, 1) for v in each),
            "max_ms": round(max(each), 1),
        }

        # the warm pool's path: clones restored and paused ahead (what ``WarmFactory``
        # does), then each claimed by a create of their shape and ``true`` run in it
        async def warm_ahead(count: int, prefix: str) -> list[str]:
            ids = [f"{prefix}{n}" for n in range(count)]
            for warm_id in ids:
                await backend.create(spec(warm_id, args.memory_mb), image)
                made.append(warm_id)
                await backend.pause(warm_id)
            await asyncio.sleep(1)  # the restores' page-ins settle, as in a pool
            return ids

        async def claim(warm_id: str, sandbox_id: str) -> float:
            t = time.monotonic()
            await backend.claim(warm_id, spec(sandbox_id, args.memory_mb))
            made[made.index(warm_id)] = sandbox_id
            await run_true(backend, sandbox_id)
            return (time.monotonic() - t) * 1000

        claims = [
            await claim(warm_id, f"claimed{n}")
            for n, warm_id in enumerate(await warm_ahead(args.creates, "warm"))
        ]
        out["warm_claim_to_first_exec_ms"] = latency_summary(claims)
        ahead = await warm_ahead(args.concurrent, "cwarm")
        each = await asyncio.gather(*(claim(w, f"cclaimed{n}") for n, w in enumerate(ahead)))
        out["concurrent_warm_claims"] = {
            "count": args.concurrent,
            "each_ms": sorted(round(v, 1) for v in each),
            "max_ms": round(max(each), 1),
        }

        # fork: a snapshot of a running VM (its whole machine), then --concurrent sandboxes
        # made from it at once, each to its first exec
        t = time.monotonic()
        snapshot = await backend.snapshot("cold", "bench-fork")
        out["fork"] = {
            "snapshot_s": round(time.monotonic() - t, 3),
            "snapshot_mib": round(snapshot.size_bytes / (1 << 20), 1),
        }
        from_snapshot = dataclasses.replace(image, layers=(snapshot.layer,))

        async def child(n: int) -> float:
            t = time.monotonic()
            await backend.create(spec(f"fork{n}", args.memory_mb), from_snapshot)
            made.append(f"fork{n}")
            await run_true(backend, f"fork{n}")
            return (time.monotonic() - t) * 1000

        each = await asyncio.gather(*(child(n) for n in range(args.concurrent)))
        out["fork"] |= {"children": args.concurrent, "each_ms": sorted(round(v, 1) for v in each)}

        for sandbox_id in list(made):
            await backend.destroy(sandbox_id)
        made.clear()
        await backend.delete_snapshot("bench-fork")
        await asyncio.sleep(1)
        before = mem_available_mib()
        for n in range(args.hold):
            await backend.create(spec(f"idle{n}", args.memory_mb), image)
            made.append(f"idle{n}")
            await run_true(backend, f"idle{n}")
        await asyncio.sleep(2)
        pss = [(await backend.usage(s)).memory_bytes or 0 for s in made]
        after = mem_available_mib()
        out["idle"] = {
            "held": args.hold,
            "memory_mb": args.memory_mb,
            "pss_mib_mean": round(sum(pss) / len(pss) / (1 << 20), 1) if pss else None,
            "mem_available_drop_mib_each": round((before - after) / max(args.hold, 1), 1),
        }
        if out["idle"]["mem_available_drop_mib_each"] > 0:
            out["idle"]["would_fit_in_24_gib"] = int(
                24 * 1024 / out["idle"]["mem_available_drop_mib_each"]
            )
    finally:
        for sandbox_id in made:
            await backend.destroy(sandbox_id)
        await backend.close()
        shutil.rmtree(root, ignore_errors=True)
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--creates", type=int, default=20)
    parser.add_argument("--concurrent", type=int, default=8)
    parser.add_argument("--execs", type=int, default=200)
    parser.add_argument("--hold", type=int, default=50)
    parser.add_argument("--memory-mb", type=int, default=256)
    parser.add_argument("--accelerator", choices=["auto", "kvm", "tcg"], default="auto")
    print(json.dumps(asyncio.run(main(parser.parse_args())), indent=2))
