"""Hostile programs in container sandboxes: each is contained, reported, and the node and
the other sandboxes keep working."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from node.sandboxes.base import RootImage
from node.sandboxes.crun.backend import CrunBackend
from tests.node.sandboxes.conftest import cgroup_file, spec
from tests.node.sandboxes.test_crun import run

pytestmark = pytest.mark.crun


async def still_works(crun: CrunBackend, sandbox_id: str) -> None:
    assert (await run(crun, sandbox_id, ["echo", "alive"])).stdout.decode() == "alive\n"


async def test_a_fork_bomb_hits_the_pids_limit(crun: CrunBackend, busybox_image: RootImage) -> None:
    await crun.create(spec("sbx-forks", pids=64), busybox_image)
    await run(crun, "sbx-forks", ["sh", "-c", "b() { b | b & }; b; sleep 2"], timeout_s=5)
    assert cgroup_file("pids", "sbx-forks", "pids.max").strip() == "64"
    assert int(cgroup_file("pids", "sbx-forks", "pids.events").split()[-1]) > 0  # refused forks
    await asyncio.sleep(0.2)
    await still_works(crun, "sbx-forks")


async def test_a_memory_bomb_is_killed_at_the_sandbox_limit(
    crun: CrunBackend, busybox_image: RootImage
) -> None:
    await crun.create(spec("sbx-mem", memory_mb=64), busybox_image)
    # 200 MB of zeros held in a pipe reader's memory: tail keeps the whole input
    result = await run(
        crun,
        "sbx-mem",
        ["sh", "-c", "dd if=/dev/zero bs=1M count=200 | tail -c 200000000 >/dev/null; echo done"],
        timeout_s=30,
    )
    assert "done" in result.stdout.decode()  # the shell survived to report it
    control = cgroup_file("memory", "sbx-mem", "memory.oom_control")
    kills = dict(line.split() for line in control.splitlines())
    assert int(kills["oom_kill"]) >= 1
    await still_works(crun, "sbx-mem")


async def test_filling_the_disk_stops_at_the_layer_size(
    crun: CrunBackend, busybox_image: RootImage, tmp_path: Path
) -> None:
    await crun.create(spec("sbx-disk", disk_mb=16, memory_mb=128), busybox_image)
    result = await run(
        crun, "sbx-disk", ["sh", "-c", "dd if=/dev/zero of=/home/user/big bs=1M count=100; df -m /"]
    )
    assert "No space left on device" in result.stderr.decode(), result
    size = (await crun.stat("sbx-disk", "/home/user/big", user="user")).size
    assert size <= 16 << 20
    usage = await crun.usage("sbx-disk")
    assert usage.disk_bytes is not None and usage.disk_bytes <= 16 << 20
    await run(crun, "sbx-disk", ["rm", "/home/user/big"])
    await still_works(crun, "sbx-disk")


async def test_killing_every_process_leaves_the_sandbox_alive(
    crun: CrunBackend, busybox_image: RootImage
) -> None:
    await crun.create(spec("sbx-killall"), busybox_image)
    await run(crun, "sbx-killall", ["kill", "-9", "-1"], user="root")
    await run(crun, "sbx-killall", ["kill", "-9", "1"], user="root")
    await still_works(crun, "sbx-killall")


async def test_overwriting_system_files_stays_in_that_sandbox(
    crun: CrunBackend, busybox_image: RootImage
) -> None:
    await crun.create(spec("sbx-vandal"), busybox_image)
    await crun.create(spec("sbx-bystander"), busybox_image)
    await run(
        crun, "sbx-vandal", ["sh", "-c", "echo gone > /etc/passwd; rm -f /bin/busybox"], user="root"
    )
    assert (busybox_image.rootfs / "etc" / "passwd").read_text().startswith("root:")
    assert (busybox_image.rootfs / "bin" / "busybox").exists()
    await still_works(crun, "sbx-bystander")
    assert "user" in (await run(crun, "sbx-bystander", ["cat", "/etc/passwd"])).stdout.decode()


async def test_no_network_and_no_host_loopback(crun: CrunBackend, busybox_image: RootImage) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    try:
        await crun.create(spec("sbx-net"), busybox_image)
        probe = await run(
            crun,
            "sbx-net",
            [
                "sh",
                "-c",
                f"echo hi | nc -w 1 127.0.0.1 {port}; echo rc=$?; "
                "wget -q -T 2 -O- http://1.1.1.1/ ; echo wget=$?",
            ],
            timeout_s=10,
        )
        assert "rc=0" not in probe.stdout.decode() and "wget=0" not in probe.stdout.decode(), probe
        listener.settimeout(0.2)
        with pytest.raises(TimeoutError):
            listener.accept()
    finally:
        listener.close()


async def test_a_sandbox_sees_neither_the_host_nor_other_sandboxes(
    crun: CrunBackend, busybox_image: RootImage
) -> None:
    await crun.create(spec("sbx-a"), busybox_image)
    await crun.create(spec("sbx-b"), busybox_image)
    await run(crun, "sbx-b", ["sh", "-c", "echo b-private > /home/user/b.txt"])
    ps = await run(crun, "sbx-a", ["ps", "-o", "pid,args"], user="root")
    assert len(ps.stdout.decode().strip().splitlines()) <= 3, (
        ps.stdout.decode()
    )  # header, init, ps itself
    found = await run(
        crun,
        "sbx-a",
        [
            "sh",
            "-c",
            "grep -rl b-private /home /tmp /root /etc /bin 2>/dev/null; echo searched",
        ],
        user="root",
    )
    assert found.stdout.decode().strip() == "searched"
    hostname = await run(crun, "sbx-a", ["hostname"])
    assert hostname.stdout.decode().strip() == "sandbox"
