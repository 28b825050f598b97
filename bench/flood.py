"""What an unread output flood costs the node: its CPU while a sandbox's ``yes`` runs.

Runs the container backend (crun, a busybox root filesystem) in a child process of its
own, the node, and in a sandbox there ``yes`` for ``--seconds``:

* ``exec``: a foreground exec (4 MiB kept per stream, the rest past the cap), its events
  collected as the node's API would;
* ``background``: a background process (the node's process table) whose output nobody
  reads after its first event.

For each it reports the node's CPU seconds over the window (``time.process_time``, all
its threads) and the sandbox's own (its cgroup's, charged to the tenant). With
``--compare REV`` the same runs on that commit's tree too, alternating (this tree, REV,
REV, this tree, ...), so a drift of the machine falls on both (the sandbox's init,
built by scripts/setup-sandboxes.sh, is this checkout's for both). Prints JSON.

    .venv/bin/python bench/flood.py --seconds 5
    .venv/bin/python bench/flood.py --seconds 5 --compare 95b455f --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
APPLETS = ("sh", "yes", "cat", "sleep", "head")


def rootfs(root: Path) -> Path:
    busybox = shutil.which("busybox") or "/bin/busybox"
    for d in ("bin", "etc", "tmp", "root", "home/user", "proc", "sys", "dev"):
        (root / d).mkdir(parents=True, exist_ok=True)
    shutil.copy2(busybox, root / "bin" / "busybox")
    for applet in APPLETS:
        (root / "bin" / applet).symlink_to("busybox")
    (root / "etc" / "passwd").write_text(
        "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/home/user:/bin/sh\n"
    )
    (root / "etc" / "group").write_text("root:x:0:\nuser:x:1000:\n")
    (root / "tmp").chmod(0o1777)
    shutil.chown(root / "home" / "user", 1000, 1000)
    return root


async def node(mode: str, seconds: float, data_dir: Path) -> dict[str, Any]:
    """In the child: one flood in one sandbox; the node's CPU and the sandbox's over it."""
    from node.sandboxes.base import RootImage
    from node.sandboxes.crun.backend import CrunBackend
    from node.sandboxes.manager import SandboxManager
    from node.sandboxes.processes import ProcessTable
    from wire.processes import StartProcess
    from wire.sandboxes import ExecRequest, SandboxSpec, collect

    image = RootImage(digest="sha256:" + "f" * 64, rootfs=rootfs(data_dir / "image"))
    backend = CrunBackend(data_dir / "data")
    await backend.start()
    manager = SandboxManager({"crun": backend}, lambda ref: image, state_dir=data_dir / "rec")
    await manager.start()
    table = ProcessTable(manager)
    sid = "sbx-flood"
    spec = SandboxSpec.model_validate(
        {"sandbox_id": sid, "tenant_id": "t", "image": "busybox", "memory_mb": 256, "pids": 64}
    )
    try:
        await manager.create(spec)
        box = (await backend.usage(sid)).cpu_ms or 0.0
        cpu, wall = time.process_time(), time.monotonic()
        if mode == "exec":
            request = ExecRequest(cmd=["yes"], timeout_s=seconds)
            result = await collect((await manager.exec(sid, request)).events())
            outcome = {"timed_out": result.timed_out, "kept": len(result.stdout)}
        else:
            request = ExecRequest(cmd=["yes"], timeout_s=seconds, max_output_bytes=64 << 20)
            events = await table.start(sid, StartProcess(request=request))
            await anext(events)  # its first event, then nobody reads
            await asyncio.sleep(seconds)
            outcome = {}
        cpu, wall = time.process_time() - cpu, time.monotonic() - wall
        box = ((await backend.usage(sid)).cpu_ms or 0.0) - box
    finally:
        await table.close()
        await manager.close()
        await backend.destroy(sid)
        await backend.close()
    return {
        "mode": mode,
        "wall_s": round(wall, 2),
        "node_cpu_s": round(cpu, 3),
        "node_core_share": round(cpu / wall, 3),
        "sandbox_cpu_s": round(box / 1000, 3),
        **outcome,
    }


def run_child(tree: Path, mode: str, seconds: float) -> dict[str, Any]:
    scratch = Path(tempfile.mkdtemp(prefix="corral-flood-"))
    env = {**os.environ, "PYTHONPATH": str(tree)}
    try:
        done = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--child", mode],
            cwd=tree,
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=seconds + 120,
            input=json.dumps({"seconds": seconds, "dir": str(scratch)}),
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if done.returncode != 0:
        raise RuntimeError(f"the node failed: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--modes", default="exec,background")
    parser.add_argument("--compare", help="also run on this earlier commit's tree")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        job = json.loads(sys.stdin.read())
        print(json.dumps(asyncio.run(node(args.child, job["seconds"], Path(job["dir"])))))
        return
    from fncall import export
    from stats import alternate

    trees = {"after": ROOT}
    if args.compare:
        trees["before"] = export(args.compare)
        # the sandbox's init is built, not committed: the earlier tree runs this one's
        built = ROOT / "deploy" / "sandbox" / "bin"
        shutil.copytree(built, trees["before"] / "deploy" / "sandbox" / "bin", dirs_exist_ok=True)
    try:
        results: dict[str, Any] = {"benchmark": "flood", "seconds": args.seconds}
        for mode in args.modes.split(","):
            runs = alternate(
                trees, args.rounds, lambda tree, mode=mode: run_child(tree, mode, args.seconds)
            )
            results[mode] = runs
        if args.compare:
            results["compare"] = args.compare
    finally:
        if "before" in trees:
            shutil.rmtree(trees["before"], ignore_errors=True)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
