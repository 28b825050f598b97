"""The machine with the real guest agent (built by scripts/setup-sandboxes.sh from
node/sandboxes/guest/corral-vmagent.c): the initramfs starts it as PID 1 on the two ports,
it answers HELLO and runs a command as root on the grown root disk. Frames are written by
hand here (the protocol's own codec is the channel's, node/sandboxes/microvm/frames.py)."""

from __future__ import annotations

import asyncio
import os
import struct
import time
from pathlib import Path

import pytest

from node.sandboxes.microvm.qemu import Vm, VmConfig
from tests.node.sandboxes.microvm.conftest import CGROUP_PARENT, MIB, VmEnv
from tests.requirements import missing

pytestmark = [pytest.mark.microvm, pytest.mark.usefixtures("no_vm_leaks")]

AGENT = Path(__file__).resolve().parents[4] / "node/sandboxes/guest/bin/corral-vmagent"
HELLO, HELLO_OK, EXEC, STARTED, EXIT, STDOUT = 1, 2, 10, 11, 12, 20


def frame(stream: int, kind: int, fields: list[tuple[str, str]]) -> bytes:
    payload = b"".join(f"{k}={v}".encode() + b"\0" for k, v in fields)
    return struct.pack("<IIHH", len(payload), stream, kind, 0) + payload


async def read_frame(reader: asyncio.StreamReader) -> tuple[int, int, bytes]:
    length, stream, kind, _ = struct.unpack("<IIHH", await reader.readexactly(12))
    assert length <= 65536
    return stream, kind, await reader.readexactly(length)


async def test_the_real_agent_answers_hello_and_runs_a_command(vm_env: VmEnv) -> None:
    if not AGENT.exists():
        missing(f"{AGENT} is not built (scripts/setup-sandboxes.sh)")
    config = VmConfig(
        kernel=vm_env.config.kernel,
        initramfs=await asyncio.to_thread(vm_env.artifacts.initramfs, AGENT),
        memory_mib=vm_env.config.memory_mib,
        cgroup_parent=CGROUP_PARENT,
    )
    started = time.monotonic()
    vm = await Vm.boot(
        vm_env.run_root, vm_env.new_id("agent"), config, disk_base=vm_env.base,
        disk_size=128 * MIB,
    )  # fmt: skip
    try:
        ctl_r, ctl_w = await asyncio.open_unix_connection(str(vm.ctl_socket))
        data_r, data_w = await asyncio.open_unix_connection(str(vm.data_socket))
        try:
            ctl_w.write(
                frame(
                    0,
                    HELLO,
                    [
                        ("time_ns", str(time.time_ns())),
                        ("entropy", os.urandom(64).hex()),
                        ("hostname", "vmtest"),
                        ("machine_id", os.urandom(16).hex()),
                    ],
                )
            )
            async with asyncio.timeout(60):
                assert await read_frame(ctl_r) == (0, HELLO_OK, b"version=1\0pid=1\0")
            print(f"cold boot to the real agent's HELLO_OK: {time.monotonic() - started:.2f} s")
            script = "echo $(id -u) $(cat /proc/1/comm) $(hostname); df -k / | tail -n 1"
            argv = [("arg", a) for a in ("/bin/sh", "-c", script)]
            fields = [("user", "root"), ("cwd", "/"), *argv, ("env", "PATH=/bin")]
            ctl_w.write(frame(1, EXEC, fields))
            out = b""
            async with asyncio.timeout(30):
                stream, kind, _ = await read_frame(ctl_r)
                assert (stream, kind) == (1, STARTED)
                while True:
                    stream, kind, payload = await read_frame(data_r)
                    assert stream == 1
                    if kind == EXIT:
                        assert payload == b"status=0\0"
                        break
                    assert kind == STDOUT
                    out += payload
            first, second = out.decode().splitlines()
            assert first == "0 corral-vmagent vmtest"
            assert int(second.split()[1]) > 100 * 1024  # the file system grew to the disk
        finally:
            ctl_w.close()
            data_w.close()
    finally:
        await vm.kill()
