"""The microVM backend for real (QEMU; KVM where it works, TCG here): sandboxes restored
from a template, commands and files through the guest agent as the user asked, limits,
pause, hostile guests, and nothing left behind (one backend and template for the module;
every sandbox restored from it)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from node.sandboxes import warm as warm_module
from node.sandboxes.base import (
    DiskFull,
    PathExists,
    PathNotFound,
    PermissionDenied,
    RootImage,
    SandboxNotRunning,
    Unsupported,
)
from node.sandboxes.microvm import qemu
from node.sandboxes.microvm.backend import MicrovmBackend
from node.sandboxes.microvm.channel import AgentChannel
from node.sandboxes.warm import WarmFactory, WarmPool
from tests.node.sandboxes.conftest import make_rootfs, read_file, spec, write_file
from tests.node.sandboxes.microvm.conftest import (
    CGROUP_PARENT,
    leftover_cgroups,
    qemu_pids,
    require_microvm,
)
from wire.sandboxes import ExecExit, ExecOutput, ExecRequest, NetworkPolicy, PtySize

pytestmark = [pytest.mark.microvm, pytest.mark.asyncio(loop_scope="module")]


@pytest.fixture(scope="module")
def place() -> Iterator[tuple[Path, RootImage]]:
    """A data directory the VM user can reach (pytest's are 0700) and a busybox image."""
    require_microvm()
    root = Path(tempfile.mkdtemp(prefix="corral-microvm-backend-"))
    try:
        root.chmod(0o755)
        rootfs = make_rootfs(root / "rootfs")
        (rootfs / "bin" / "busybox").chmod(0o755)
        (rootfs / "etc" / "secret").chmod(0o600)
        (rootfs / "etc" / "machine-id").write_text("")  # as Debian's images ship it
        yield root, RootImage(digest="sha256:" + "d" * 64, rootfs=rootfs, env=(("IMG", "1"),))
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def backend(place: tuple[Path, RootImage]) -> AsyncIterator[MicrovmBackend]:
    root, _ = place
    made = MicrovmBackend(root / "data", cgroup_parent=CGROUP_PARENT)
    assert await made.start() == []
    try:
        yield made
    finally:
        for sandbox_id in list(made._machines):
            await made.destroy(sandbox_id)
        await made.close()
        vms = made.run_root
        assert qemu_pids(str(vms)) == [] and sorted(os.listdir(vms)) == []
        assert leftover_cgroups() == []


@pytest_asyncio.fixture(loop_scope="module")
async def sandbox(backend: MicrovmBackend, place: tuple[Path, RootImage]) -> AsyncIterator[str]:
    """A sandbox restored from the module's template, destroyed after the test."""
    sandbox_id = f"vm{os.getpid()}x{time.monotonic_ns() % 10**9}"
    await backend.create(spec(sandbox_id, memory_mb=192), place[1])
    try:
        yield sandbox_id
    finally:
        await backend.destroy(sandbox_id)
        assert not (backend.run_root / sandbox_id).exists()


def _is_qemu(pid: int) -> bool:
    try:
        return b"qemu" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


async def run(
    backend: MicrovmBackend, sandbox_id: str, *cmd: str, user: str = "user", **kw: object
) -> tuple[int | None, bytes, bytes, ExecExit]:
    process = await backend.exec(
        sandbox_id,
        ExecRequest(cmd=list(cmd), **kw),
        default_user=user,  # type: ignore[arg-type]
    )
    out, err = bytearray(), bytearray()
    end: ExecExit | None = None
    async for event in process.events():
        if isinstance(event, ExecOutput):
            (err if event.stream == "stderr" else out).extend(event.data)
        elif isinstance(event, ExecExit):
            end = event
    assert end is not None
    return end.exit_code, bytes(out), bytes(err), end


async def test_a_sandbox_is_a_restored_vm_with_its_own_kernel_clock_and_name(
    backend: MicrovmBackend, sandbox: str
) -> None:
    assert backend.accelerator in ("kvm", "tcg")
    code, out, _, _ = await run(
        backend, sandbox, "sh", "-c", "uname -r; hostname; date +%s; cat /etc/machine-id"
    )
    kernel, hostname, clock, machine_id = out.decode().split()
    assert code == 0 and kernel.endswith("cloud-amd64") and kernel != os.uname().release
    assert hostname == sandbox
    assert abs(int(clock) - time.time()) < 30  # set by HELLO, not the template's moment
    assert len(machine_id) == 32


async def test_two_clones_of_one_template_get_different_entropy_and_identity(
    backend: MicrovmBackend, place: tuple[Path, RootImage]
) -> None:
    ids = [f"twin{os.getpid()}{n}" for n in range(2)]
    await asyncio.gather(*(backend.create(spec(i, memory_mb=192), place[1]) for i in ids))
    try:
        seen = [
            (await run(backend, i, "sh", "-c", "head -c 16 /dev/urandom | od -An -tx1; hostname"))[
                1
            ]
            for i in ids
        ]
        assert seen[0] != seen[1]
    finally:
        for i in ids:
            await backend.destroy(i)


async def test_commands_run_as_the_user_with_the_env_cwd_stdin_and_exit_codes(
    backend: MicrovmBackend, sandbox: str
) -> None:
    code, out, _, _ = await run(
        backend, sandbox, "sh", "-c", 'id -u; echo "$HOME $IMG $X"; pwd', env={"X": "y"}
    )
    assert code == 0 and out.decode().split() == ["1000", "/home/user", "1", "y", "/home/user"]
    code, out, _, _ = await run(backend, sandbox, "id", "-u", user="root", cwd="/tmp")
    assert (code, out) == (0, b"0\n")
    code, out, _, _ = await run(backend, sandbox, "cat", stdin="fed\n")
    assert (code, out) == (0, b"fed\n")
    code, _, err, _ = await run(backend, sandbox, "no-such-program")
    assert code == 127 and b"no-such-program" in err
    code, _, _, _ = await run(backend, sandbox, "sh", "-c", "exit 7")
    assert code == 7
    code, _, err, _ = await run(backend, sandbox, "cat", "/etc/secret")
    assert code != 0 and b"Permission denied" in err  # the guest kernel says so


async def test_a_timeout_kills_the_whole_session(backend: MicrovmBackend, sandbox: str) -> None:
    code, _, _, end = await run(
        backend, sandbox, "sh", "-c", "sleep 1000 & sleep 1000", timeout_s=1.0
    )
    assert end.timed_out and code is None and end.signal == 9
    _, out, _, _ = await run(backend, sandbox, "ps", "-o", "comm")
    assert b"sleep" not in out


async def test_output_is_capped_and_a_flood_does_not_stop_other_calls(
    backend: MicrovmBackend, sandbox: str
) -> None:
    flood = await backend.exec(
        sandbox, ExecRequest(cmd=["yes"], timeout_s=30, max_output_bytes=1000), default_user="user"
    )
    flood.pause_output()  # nobody reads it: it blocks in the guest, not on the host
    code, out, _, _ = await run(backend, sandbox, "echo", "still")
    assert (code, out) == (0, b"still\n")
    flood.resume_output()
    kept, killed = 0, False
    async for event in flood.events():
        if isinstance(event, ExecOutput):
            kept += len(event.data)
            if not killed:  # only once output came (a slow guest may not have written yet)
                killed = True
                await flood.signal(9)
        elif isinstance(event, ExecExit):
            assert event.stdout_truncated and event.signal == 9
    assert killed and kept == 1000


async def test_a_terminal_runs_a_shell_and_resizes(backend: MicrovmBackend, sandbox: str) -> None:
    process = await backend.exec(
        sandbox,
        ExecRequest(cmd=["sh"], pty=PtySize(cols=100, rows=30), stdin_open=True),
        default_user="user",
    )
    await process.resize(PtySize(cols=120, rows=40))
    await process.write_stdin(b"stty size; exit 3\n")
    out = bytearray()
    code = None
    async for event in process.events():
        if isinstance(event, ExecOutput):
            assert event.stream == "pty"
            out.extend(event.data)
        elif isinstance(event, ExecExit):
            code = event.exit_code
    assert b"40 120" in out and code == 3


async def test_files_round_trip_as_the_user_with_pages_and_errors(
    backend: MicrovmBackend, sandbox: str
) -> None:
    data = os.urandom(3 << 20)
    entry = await write_file(backend, sandbox, "big.bin", data)
    assert (entry.path, entry.size, entry.owner) == ("/home/user/big.bin", len(data), "1000")
    assert await read_file(backend, sandbox, "/home/user/big.bin", max_bytes=4 << 20) == data
    with pytest.raises(PermissionDenied):
        await read_file(backend, sandbox, "/etc/secret")
    assert await read_file(backend, sandbox, "/etc/secret", user="root") == b"image-only\n"
    with pytest.raises(PathNotFound):
        await backend.stat(sandbox, "/nowhere", user="user")
    await backend.make_dir(sandbox, "d/e", user="user")
    with pytest.raises(PathExists):
        await backend.make_dir(sandbox, "d", user="user")
    for n in range(5):
        await write_file(backend, sandbox, f"d/f{n}", b"x")
    first = await backend.list_dir(sandbox, "d", user="user", limit=3)
    rest = await backend.list_dir(sandbox, "d", user="user", cursor=first.next_cursor)
    names = [e.name for e in first.entries + rest.entries]
    assert names == ["e", "f0", "f1", "f2", "f3", "f4"] and rest.next_cursor is None
    moved = await backend.move(sandbox, "d/f0", "/home/user/g", user="user")
    assert moved.path == "/home/user/g"
    await backend.remove(sandbox, "d", user="user")
    with pytest.raises(PathNotFound):
        await backend.stat(sandbox, "d", user="user")


async def test_a_full_disk_is_said_and_the_sandbox_goes_on(
    backend: MicrovmBackend, sandbox: str
) -> None:
    # a child that ends with the host's bytes unread must still answer (it did not: the
    # agent lost its ERROR behind the socket's reset and the write waited for ever)
    async with asyncio.timeout(70):
        await run(backend, sandbox, "sh", "-c", "cat /dev/zero > /home/user/fill", timeout_s=60)
    for _ in range(3):
        with pytest.raises(DiskFull):
            async with asyncio.timeout(30):
                await write_file(backend, sandbox, "more", os.urandom(1 << 20))
    async with asyncio.timeout(30):
        await run(backend, sandbox, "rm", "/home/user/fill")
    assert (await run(backend, sandbox, "true"))[0] == 0


async def test_a_paused_vm_refuses_calls_at_once_and_resumes(
    backend: MicrovmBackend, sandbox: str
) -> None:
    await backend.pause(sandbox)
    with pytest.raises(SandboxNotRunning):
        await backend.exec(sandbox, ExecRequest(cmd=["true"]), default_user="user")
    await backend.resume(sandbox)
    assert (await run(backend, sandbox, "true"))[0] == 0
    usage = await backend.usage(sandbox)
    assert usage.memory_bytes and usage.cpu_ms and usage.disk_bytes and not usage.ended


async def test_a_guest_that_panics_ends_its_sandbox_and_leaves_nothing(
    backend: MicrovmBackend, place: tuple[Path, RootImage]
) -> None:
    sandbox_id = f"panic{os.getpid()}"
    await backend.create(spec(sandbox_id, memory_mb=192), place[1])
    try:
        with contextlib.suppress(Exception):
            await run(backend, sandbox_id, "sh", "-c", "echo c > /proc/sysrq-trigger", user="root")
        for _ in range(200):
            if (await backend.usage(sandbox_id)).ended:
                break
            await asyncio.sleep(0.05)
        assert (await backend.usage(sandbox_id)).ended
        with pytest.raises(SandboxNotRunning):
            await backend.exec(sandbox_id, ExecRequest(cmd=["true"]), default_user="user")
    finally:
        await backend.destroy(sandbox_id)
    assert not (backend.run_root / sandbox_id).exists()


async def test_a_fork_bomb_stops_at_the_sandboxs_pids_and_the_vm_goes_on(
    backend: MicrovmBackend, sandbox: str
) -> None:
    """A fork bomb (as root in the guest) meets the commands' pids limit (the sandbox's
    ``pids``: 64 here) and its time-out; the VM stays in its memory, and the agent still
    runs the next command."""
    # the leader waits, so the bomb runs until its time-out (a leader that exits ends its
    # session at once)
    bomb = "b() { b | b & }; b; sleep 60"
    _, _, _, ended = await run(backend, sandbox, "sh", "-c", bomb, user="root", timeout_s=3)
    assert ended.timed_out
    usage = await backend.usage(sandbox)
    assert usage.memory_bytes is not None and usage.memory_bytes < (192 + 200) << 20
    code, out, err, _ = await run(
        backend, sandbox, "sh", "-c", "cd /sys/fs/cgroup/corral-commands; cat pids.max pids.events"
    )
    assert code == 0, err
    limit, _, hits = out.decode().split()
    assert limit == "64" and int(hits) > 0  # the bomb met the limit


async def test_what_it_cannot_do_yet_is_refused_clearly(
    backend: MicrovmBackend, place: tuple[Path, RootImage]
) -> None:
    networked = spec("net1", memory_mb=192, network=NetworkPolicy(allow=["10.1.2.3"]))
    with pytest.raises(Unsupported):
        await backend.create(networked, place[1])


async def test_a_snapshot_holds_the_whole_machine_and_forks_run_on_from_it(
    backend: MicrovmBackend, place: tuple[Path, RootImage], sandbox: str
) -> None:
    """A snapshot of a running VM keeps its memory (a tmpfs file lives only there) and its
    disk; each sandbox made from it runs on from that moment as a machine of its own
    (its identity, its own later writes), and the parent goes on as it was."""
    _, image = place
    setup = "mkdir -p /mnt/ram && mount -t tmpfs ram /mnt/ram && echo in-memory > /mnt/ram/x"
    assert (await run(backend, sandbox, "sh", "-c", setup, user="root"))[0] == 0
    assert (await run(backend, sandbox, "sh", "-c", "echo on-disk > /home/user/d"))[0] == 0
    made = await backend.snapshot(sandbox, "snap1")
    assert made.size_bytes > 0 and backend.snapshot_layer("snap1") == made
    children = [f"fork{os.getpid()}x{n}" for n in range(2)]
    from_snapshot = dataclasses.replace(image, layers=(made.layer,))
    try:
        # the parent goes on, and what it does now is its own
        assert (await run(backend, sandbox, "sh", "-c", "echo later > /home/user/d"))[0] == 0
        for child in children:
            await backend.create(spec(child, memory_mb=192), from_snapshot)
        for child in children:
            code, out, err, _ = await run(
                backend, child, "sh", "-c", "cat /mnt/ram/x /home/user/d; hostname"
            )
            assert code == 0, err
            assert out.decode().split() == ["in-memory", "on-disk", child]
        await run(backend, children[0], "sh", "-c", "echo mine > /home/user/d")
        assert (await run(backend, children[1], "cat", "/home/user/d"))[1] == b"on-disk\n"
        assert (await run(backend, sandbox, "cat", "/home/user/d"))[1] == b"later\n"
        # another size than the machine's is refused, clearly
        with pytest.raises(Unsupported):
            await backend.create(spec("bigger", memory_mb=256), from_snapshot)
    finally:
        for child in children:
            await backend.destroy(child)
        await backend.delete_snapshot("snap1")
    assert backend.snapshot_layer("snap1") is None and not made.layer.exists()


async def test_vms_an_earlier_node_left_are_found_and_reaped(
    backend: MicrovmBackend, place: tuple[Path, RootImage]
) -> None:
    """Two VMs outlive their node: one as made, one a warm clone claimed by a sandbox
    (known by its alias): the next node finds both by the ids the manager knows."""
    root, image = place
    # the accelerator the module's backend probed (KVM where it works), not probed again
    accel = backend.accelerator
    assert accel in ("kvm", "tcg")
    first = MicrovmBackend(root / "crashed", cgroup_parent=CGROUP_PARENT, accelerator=accel)
    await first.start()
    await first.create(spec("orphan1", memory_mb=192), image)
    await first.create(spec("warm-orphan", memory_mb=192), image)
    await first.pause("warm-orphan")
    await first.claim("warm-orphan", spec("claimed1", memory_mb=192))
    pids = [first._machines[i].vm.pid for i in ("orphan1", "claimed1")]
    first._machines.clear()  # the node process "dies": nothing of it is released
    second = MicrovmBackend(root / "crashed", cgroup_parent=CGROUP_PARENT, accelerator=accel)
    assert await second.start() == ["claimed1", "orphan1"]
    await second.destroy("orphan1")
    await second.destroy("claimed1")
    await asyncio.sleep(0.1)
    assert not any(_is_qemu(pid) for pid in pids)
    assert qemu_pids(str(second.run_root)) == [] and os.listdir(second.run_root) == []


async def test_a_warm_clone_waits_paused_and_becomes_the_sandbox_that_claims_it(
    backend: MicrovmBackend, place: tuple[Path, RootImage], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The node's warm pool keeps a clone restored and paused; a create of its shape claims
    it (a new clock, hostname and machine id, its files by the sandbox's id), another
    shape is not offered one, and nothing of either is left."""
    _, image = place
    # the module template's size (``spec``'s disk), so no other template is booted
    monkeypatch.setattr(warm_module, "WARM_MEMORY_MB", 192)
    monkeypatch.setattr(warm_module, "WARM_DISK_MB", spec("x").disk_mb)
    machine_ids: dict[str, str] = {}  # hostname -> the machine id its HELLO gave
    hello = AgentChannel.hello

    async def recorded(self: AgentChannel, **fields: Any) -> None:
        machine_ids[fields["hostname"]] = fields["machine_id"]
        await hello(self, **fields)

    monkeypatch.setattr(AgentChannel, "hello", recorded)
    key = WarmFactory.key("microvm", image.digest)
    pool = WarmPool({"microvm": backend}, {key: ("microvm", image, 1)}, max_warm=2)
    await pool.start()
    wanted = spec(f"claimed{os.getpid()}", memory_mb=192, backend="microvm")
    try:
        assert pool.offers(spec("bigger", memory_mb=256, backend="microvm"), image.digest) is None
        assert pool.offers(wanted, image.digest) == key
        warm = await pool.take(key, context="test")
        assert backend._machines[warm.id].paused
        await backend.claim(warm.id, wanted)
        assert warm.id not in backend._machines
        assert warm.id not in qemu.leftovers(backend.run_root)
        assert wanted.sandbox_id in qemu.leftovers(backend.run_root)
        code, out, _, _ = await run(
            backend, wanted.sandbox_id, "sh", "-c", "hostname; cat /etc/machine-id; date +%s"
        )
        hostname, machine_id, clock = out.decode().split()
        assert code == 0 and hostname == wanted.sandbox_id
        # the claim's machine id, not the one the warm clone was given
        assert machine_id == machine_ids[wanted.sandbox_id] != machine_ids[warm.id]
        assert abs(int(clock) - time.time()) < 30
    finally:
        await backend.destroy(wanted.sandbox_id)
        await pool.close()
    assert not (backend.run_root / wanted.sandbox_id).exists()
    assert not (backend.run_root / wanted.sandbox_id).is_symlink()
