"""The walls a root agent meets in a container sandbox, on crun and runc (security review
3, findings #18, #23 and #24): its own user namespace and host id range, an init it
cannot take over, and no host-wide kernel maps, identifiers or figures."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from node.sandboxes.base import RootImage
from node.sandboxes.crun.backend import CrunBackend
from node.sandboxes.crun.process import CrunProcess
from node.sandboxes.crun.uidranges import SIZE
from tests.node.sandboxes.conftest import spec, started_backend
from tests.node.sandboxes.test_crun import run
from tests.requirements import missing
from wire.sandboxes import ExecRequest, collect

pytestmark = pytest.mark.crun


@pytest_asyncio.fixture(params=["crun", "runc"])
async def crun(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[CrunBackend]:
    async with started_backend(tmp_path / "data", runtime=request.param) as backend:
        yield backend


def host_ids(pid: int) -> tuple[int, int]:
    """The real uid and gid the host sees for ``pid``."""
    with open(f"/proc/{pid}/status") as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
    return int(fields["Uid"].split()[0]), int(fields["Gid"].split()[0])


async def host_ids_of_a_command(
    backend: CrunBackend, sandbox_id: str, user: str
) -> tuple[int, int]:
    process = await backend.exec(
        sandbox_id, ExecRequest(cmd=["sleep", "5"], timeout_s=10), default_user=user
    )
    assert isinstance(process, CrunProcess)
    try:
        return host_ids(process.host_pid)
    finally:
        await process.kill()
        await collect(process.events())


async def test_root_inside_is_an_unprivileged_host_uid_of_a_range_no_other_sandbox_holds(
    crun: CrunBackend, busybox_image: RootImage
) -> None:
    await crun.create(spec("sbx-ns-a"), busybox_image)
    await crun.create(spec("sbx-ns-b"), busybox_image)
    firsts = []
    for sandbox_id in ("sbx-ns-a", "sbx-ns-b"):
        root_uid, root_gid = await host_ids_of_a_command(crun, sandbox_id, "root")
        user_uid, _ = await host_ids_of_a_command(crun, sandbox_id, "user")
        assert root_uid >= 1 << 16 and root_gid == root_uid  # never host root, nor a host user
        assert user_uid == root_uid + 1000
        mapped = (
            (await run(crun, sandbox_id, ["cat", "/proc/self/uid_map"])).stdout.decode().split()
        )
        assert mapped == ["0", str(root_uid), str(SIZE)]
        firsts.append(root_uid)
    assert abs(firsts[0] - firsts[1]) >= SIZE  # disjoint ranges
    # inside, the ids are the image's own
    listing = await run(crun, "sbx-ns-a", ["stat", "-c", "%u:%g", "/home/user", "/etc/passwd"])
    assert listing.stdout.decode().split() == ["1000:1000", "0:0"]
    created = await run(crun, "sbx-ns-a", ["sh", "-c", "echo x > /tmp/f; stat -c %u /tmp/f"])
    assert created.stdout.decode().strip() == "1000"


async def test_the_image_serves_every_range_and_stays_as_it_was(
    crun: CrunBackend, busybox_image: RootImage
) -> None:
    before = os.stat(busybox_image.rootfs / "etc" / "passwd")
    await crun.create(spec("sbx-img"), busybox_image)
    await run(
        crun,
        "sbx-img",
        ["sh", "-c", "echo evil >> /etc/passwd; chown 1000 /etc/group"],
        user="root",
    )
    owners = await run(crun, "sbx-img", ["stat", "-c", "%u", "/etc/passwd", "/etc/group"])
    assert owners.stdout.decode().split() == ["0", "1000"]  # copied up, owned as inside
    after = os.stat(busybox_image.rootfs / "etc" / "passwd")
    assert (after.st_uid, after.st_size, after.st_mtime) == (
        before.st_uid,
        before.st_size,
        before.st_mtime,
    )
    assert os.stat(busybox_image.rootfs / "etc" / "group").st_uid == 0


async def test_an_id_range_is_freed_with_its_sandbox(
    crun: CrunBackend, busybox_image: RootImage
) -> None:
    assert crun.ranges is not None
    await crun.create(spec("sbx-range"), busybox_image)
    held = crun.ranges.held(crun.root / "sbx-range")
    assert held is not None
    assert crun.ranges.rootfs(held).is_mount()
    await crun.destroy("sbx-range")
    assert crun.ranges.held(crun.root / "sbx-range") is None
    assert not (crun.ranges.registry / str(held.slot)).exists()
    assert not crun.ranges.rootfs(held).exists()


async def test_a_snapshot_keeps_the_ids_of_inside_and_a_sandbox_of_another_range_sees_them(
    crun: CrunBackend, busybox_image: RootImage
) -> None:
    await crun.create(spec("sbx-snap-src"), busybox_image)
    await run(crun, "sbx-snap-src", ["sh", "-c", "echo mine > /home/user/kept"])
    await run(crun, "sbx-snap-src", ["sh", "-c", "echo root > /root/r"], user="root")
    files = await crun.snapshot("sbx-snap-src", "snap_ids")
    assert os.stat(files.layer / "home" / "user" / "kept").st_uid == 1000  # stored as inside
    assert os.stat(files.layer / "root" / "r").st_uid == 0
    image = RootImage(
        digest=busybox_image.digest, rootfs=busybox_image.rootfs, layers=(files.layer,)
    )
    await crun.create(spec("sbx-snap-dst"), image)
    seen = await run(crun, "sbx-snap-dst", ["stat", "-c", "%u", "/home/user/kept", "/root/r"])
    assert seen.stdout.decode().split() == ["1000", "0"]
    edited = await run(crun, "sbx-snap-dst", ["sh", "-c", "echo more >> /home/user/kept"])
    assert edited.exit_code == 0  # the user still owns its file
    source = await host_ids_of_a_command(crun, "sbx-snap-src", "user")
    assert await host_ids_of_a_command(crun, "sbx-snap-dst", "user") != source


async def holding(crun: CrunBackend, sandbox_id: str, program: str, *, timeout_s: float) -> Any:
    """``program`` run by python3 as the sandbox's user, once it has printed ``held``."""
    process = await crun.exec(
        sandbox_id,
        ExecRequest(cmd=["python3", "-c", program], timeout_s=timeout_s),
        default_user="user",
    )
    async for event in process.events():
        if getattr(event, "data", b"").startswith(b"held"):
            break
    return process


async def test_per_user_kernel_limits_count_per_sandbox(
    crun: CrunBackend, python_image: RootImage
) -> None:
    """Review #24: one tenant's pipes no longer shrink another's (the host's
    pipe-user-pages-soft is per host user, and uid 1000 is now a different one in each)."""
    await crun.create(spec("sbx-pipes-a", image="python", memory_mb=256), python_image)
    await crun.create(spec("sbx-pipes-b", image="python", memory_mb=256), python_image)
    hog = (
        "import fcntl, os, sys, time\n"
        "held = []\n"
        "for _ in range(80):\n"
        "    r, w = os.pipe(); held += [r, w]\n"
        "    try: fcntl.fcntl(w, 1031, 1 << 20)\n"  # F_SETPIPE_SZ, refused past the limit
        "    except PermissionError: pass\n"
        "print('held', flush=True); time.sleep(20)\n"
    )
    hogging = await holding(crun, "sbx-pipes-a", hog, timeout_s=30)
    size = "import fcntl, os; r, w = os.pipe(); print(fcntl.fcntl(w, 1032))"  # F_GETPIPE_SZ
    # the hog's own uid is past the soft limit: its next pipe is cut to one page or two
    own = await run(crun, "sbx-pipes-a", ["python3", "-c", size])
    other = await run(crun, "sbx-pipes-b", ["python3", "-c", size])
    assert int(own.stdout.decode()) < 65536, own
    assert int(other.stdout.decode()) == 65536, other
    assert isinstance(hogging, CrunProcess)
    await hogging.kill()


PROBE_USER_LIMITS = (
    "import ctypes, errno, os, resource\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "fd = libc.inotify_init1(0)\n"
    "watch = 'ok' if fd >= 0 else errno.errorcode[ctypes.get_errno()]\n"
    "resource.setrlimit(resource.RLIMIT_NPROC, (10, 10))\n"
    "try:\n"
    "    pid = os.fork()\n"
    "    if pid == 0: os._exit(0)\n"
    "    os.waitpid(pid, 0); fork = 'ok'\n"
    "except BlockingIOError: fork = 'EAGAIN'\n"
    "print(watch, fork)\n"
)


async def test_processes_count_per_sandbox_and_inotify_is_nobodys_to_use_up(
    crun: CrunBackend, python_image: RootImage
) -> None:
    """Review #24 beyond pipes. The kernel counts a user's processes (RLIMIT_NPROC) per
    host uid: an agent holding 20 processes in one sandbox reaches its own limit, never
    its neighbour's (with one host uid for every sandbox's user, the neighbour's fork was
    refused). inotify instances and watches are counted up the chain of user namespaces
    to the namespace's creator, host root, whose 128 instances the node's own watchers
    use: the sandbox's filter refuses inotify, so no sandbox can use them up."""
    await crun.create(spec("sbx-count-a", image="python", memory_mb=256), python_image)
    await crun.create(spec("sbx-count-b", image="python", memory_mb=256), python_image)
    hog = (
        "import os, time\n"
        "for _ in range(20):\n"
        "    if os.fork() == 0: time.sleep(30); os._exit(0)\n"
        "print('held', flush=True); time.sleep(30)\n"
    )
    hogging = await holding(crun, "sbx-count-a", hog, timeout_s=40)
    own = await run(crun, "sbx-count-a", ["python3", "-c", PROBE_USER_LIMITS])
    other = await run(crun, "sbx-count-b", ["python3", "-c", PROBE_USER_LIMITS])
    assert own.stdout.decode().split() == ["EPERM", "EAGAIN"], own
    assert other.stdout.decode().split() == ["EPERM", "ok"], other
    assert isinstance(hogging, CrunProcess)
    await hogging.kill()


async def test_root_inside_cannot_take_over_the_sandboxs_init(
    crun: CrunBackend, python_image: RootImage
) -> None:
    """Review #18: /proc/1/mem, prlimit and priority of PID 1, its fds and environment."""
    await crun.create(spec("sbx-init", image="python", memory_mb=256), python_image)
    attacks = {
        "mem": "open('/proc/1/mem', 'r+b')",
        "prlimit": "import resource; resource.prlimit(1, resource.RLIMIT_NOFILE, (5, 5))",
        "nice": "import os; os.setpriority(os.PRIO_PROCESS, 1, 19)",
        "nice-user": "import os; os.setpriority(os.PRIO_USER, 0, 19)",
        "affinity": "import os; os.sched_setaffinity(1, {0})",
        "fd": "import os; os.readlink('/proc/1/fd/0')",
        "environ": "open('/proc/1/environ').read()",
        "ptrace": (
            "import ctypes; libc = ctypes.CDLL(None, use_errno=True)\n"
            "if libc.ptrace(16, 1, 0, 0) != 0: raise PermissionError(ctypes.get_errno())"
        ),
    }
    for name, attack in attacks.items():
        result = await run(crun, "sbx-init", ["python3", "-c", attack], user="root")
        assert result.exit_code == 1 and "PermissionError" in result.stderr.decode(), (name, result)
    # the review's wedge: after all of it, commands still start
    for _ in range(3):
        assert (await run(crun, "sbx-init", ["echo", "still"])).stdout.decode() == "still\n"
    own = await run(
        crun,
        "sbx-init",
        [
            "python3",
            "-c",
            "import resource as r; r.setrlimit(r.RLIMIT_NOFILE, (64, 64)); print('ok')",
        ],
        user="root",
    )
    assert own.stdout.decode() == "ok\n"  # a process may still set its own limits


async def test_root_inside_sees_no_host_wide_kernel_maps_identifiers_or_paths(
    crun: CrunBackend, busybox_image: RootImage, tmp_path: Path
) -> None:
    """Review #23."""
    await crun.create(spec("sbx-host"), busybox_image)
    for path in (
        "/proc/kpagecgroup",
        "/proc/kpageflags",
        "/proc/kpagecount",
        "/proc/slabinfo",
        "/proc/cmdline",
        "/proc/sys/kernel/random/boot_id",
    ):
        read = await run(crun, "sbx-host", ["sh", "-c", f"cat {path} | wc -c"], user="root")
        assert read.stdout.decode().strip() == "0", (path, read)
    mountinfo = (await run(crun, "sbx-host", ["cat", "/proc/self/mountinfo"])).stdout.decode()
    for host_path in (str(tmp_path), str(crun.root), str(crun.init_binary.parent), "/run/corral"):
        assert host_path not in mountinfo, host_path
    assert str(busybox_image.rootfs) not in mountinfo


async def test_memory_and_cpus_read_in_proc_are_the_sandboxs_own(
    crun: CrunBackend, busybox_image: RootImage
) -> None:
    if not crun.lxcfs.serving:
        missing("lxcfs does not serve here (scripts/setup-sandboxes.sh installs it)")
    await crun.create(spec("sbx-figures", memory_mb=96, cpu=1.0), busybox_image)
    meminfo = (
        (await run(crun, "sbx-figures", ["head", "-1", "/proc/meminfo"])).stdout.decode().split()
    )
    assert meminfo[:3] == ["MemTotal:", str(96 * 1024), "kB"]
    online = (
        await run(crun, "sbx-figures", ["cat", "/sys/devices/system/cpu/online"])
    ).stdout.decode()
    assert online.strip() == "0"  # one CPU's quota: one CPU
    cpus = (
        await run(crun, "sbx-figures", ["grep", "-c", "^processor", "/proc/cpuinfo"])
    ).stdout.decode()
    assert cpus.strip() == "1"


async def test_all_sandboxes_together_stay_within_the_nodes_sandbox_memory(
    tmp_path: Path, busybox_image: RootImage
) -> None:
    """Each within its own limit, together past the node's: the kernel kills inside the
    sandboxes, never elsewhere on the host."""
    parent = f"corral-test-{uuid.uuid4().hex[:8]}"
    try:
        async with started_backend(
            tmp_path / "data", memory_limit_mb=160, cgroup_parent=parent
        ) as backend:
            group = Path("/sys/fs/cgroup/memory") / parent
            assert int((group / "memory.limit_in_bytes").read_text()) == 160 << 20
            for name in ("sbx-share-a", "sbx-share-b"):
                await backend.create(spec(name, memory_mb=128), busybox_image)
            hold = "dd if=/dev/zero bs=1M count=100 | tail -c 100000000 >/dev/null; echo done"
            results = await asyncio.gather(
                *(
                    run(backend, name, ["sh", "-c", hold], timeout_s=30)
                    for name in ("sbx-share-a", "sbx-share-b")
                )
            )
            assert all("done" in r.stdout.decode() for r in results)  # the shells lived to say so
            kills = 0
            for name in ("sbx-share-a", "sbx-share-b"):
                control = (group / name / "memory.oom_control").read_text()
                kills += int(dict(line.split() for line in control.splitlines())["oom_kill"])
            assert kills >= 1
    finally:
        for made in Path("/sys/fs/cgroup").glob(f"*/{parent}"):  # noqa: ASYNC240 - cgroupfs
            made.rmdir()


async def test_a_node_that_stops_without_closing_leaves_no_mount_in_its_data_dir(
    tmp_path: Path, busybox_image: RootImage
) -> None:
    """A crashed node's data dir can be removed: nothing of the backend's own (its copy of
    init, its LXCFS) is mounted there, only what each live sandbox holds."""
    data = tmp_path / "data"
    backend = CrunBackend(data)
    await backend.start()
    await backend.create(spec("sbx-crashed"), busybox_image)
    await backend.destroy("sbx-crashed")  # and then the node dies: no close()
    with open("/proc/self/mountinfo") as f:  # noqa: ASYNC230 - procfs
        held = [line.split()[4] for line in f if line.split()[4].startswith(str(data))]
    assert held == []
