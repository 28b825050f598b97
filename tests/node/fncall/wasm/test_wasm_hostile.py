"""Hostile guests and uploads against the wasm runtime (real wasmtime, real processes).

Each test is an attack and the wall that must stop it: the host environment and the
node's secrets, files beyond the preopen, threads, CPU exhaustion of the node, huge
modules and declarations, a dying worker, a tampered ``.cwasm`` cache, and time judged
fairly. ``guest_process`` names the process guests run in: the worker's, or the node's
own when a runtime has no worker (the design these tests were written against).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
from wasmtime import wat2wasm

from node.fncall.wasm import WasmBackend
from wire.execution import StageStatus

pytestmark = pytest.mark.asyncio(loop_scope="module")

RunFn = Callable[..., Coroutine[Any, Any, Any]]
REDIS_SECRET = "redis://:node-secret-7f3a@127.0.0.1:6399/8"
EXPECTED_UID = 65534


def wat(body: str) -> bytes:
    return bytes(wat2wasm(f"(module {body})"))


def print_module(text: str) -> bytes:
    """A WASI command that prints ``text`` (distinct text, distinct module)."""
    data = text.encode()
    return wat(
        '(import "wasi_snapshot_preview1" "fd_write" '
        "(func $w (param i32 i32 i32 i32) (result i32)))"
        '(memory (export "memory") 1)'
        f'(data (i32.const 16) "{data.decode()}")'
        f'(data (i32.const 0) "\\10\\00\\00\\00\\{len(data):02x}\\00\\00\\00")'
        '(func (export "_start") (drop (call $w (i32.const 1) (i32.const 0) (i32.const 1) '
        "(i32.const 8))))"
    )


def _uleb(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _section(ident: int, body: bytes) -> bytes:
    return bytes([ident]) + _uleb(len(body)) + body


def _vec(items: list[bytes]) -> bytes:
    return _uleb(len(items)) + b"".join(items)


def _name(text: str) -> bytes:
    return _uleb(len(text)) + text.encode()


def binary_module(bodies: list[bytes], *, params: int = 0, data: bytes = b"") -> bytes:
    """A WASI command of ``len(bodies)`` functions (the first is ``_start``, with
    ``params`` i32 parameters ignored by a wrapper), one memory, and ``data`` at 0."""
    pages = max(1, (len(data) >> 16) + 1)
    types = _section(1, _vec([b"\x60\x00\x00", b"\x60" + _vec([b"\x7f"] * params) + b"\x01\x7f"]))
    funcs = _section(3, _vec([_uleb(0)] + [_uleb(1)] * len(bodies)))
    memory = _section(5, _vec([b"\x00" + _uleb(pages)]))
    exports = _section(7, _vec([_name("_start") + b"\x00\x00", _name("memory") + b"\x02\x00"]))
    code_bodies = [_uleb(2) + b"\x00\x0b"]  # _start: no locals, end
    code_bodies += [_uleb(len(body) + 1) + b"\x00" + body for body in bodies]
    code = _section(10, _vec(code_bodies))
    sections = types + funcs + memory + exports + code
    if data:
        segment = b"\x00\x41\x00\x0b" + _uleb(len(data)) + data  # active, i32.const 0
        sections += _section(11, _vec([segment]))
    return b"\0asm\x01\0\0\0" + sections


def huge_module(functions: int = 20000) -> bytes:
    """A valid module that takes seconds of CPU to compile: many distinct functions of
    multiplications and loads (the security review's ``wasmgen.many_funcs``)."""
    bodies = []
    for f in range(functions):
        body = bytearray(b"\x20\x00")  # local.get 0
        for r in range(20):
            body += b"\x41" + _uleb((f * 31 + r) & 0x3FFF) + b"\x6c\x28\x02\x00"
        bodies.append(bytes(body) + b"\x0b")
    return binary_module(bodies, params=1)


def big_data_module(tag: int, mib: int) -> bytes:
    """A distinct module whose compiled form is about ``mib`` MiB (its data segment)."""
    return binary_module([], data=bytes([tag % 251 + 1]) * (mib << 20))


def running(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def guest_process(rt: WasmBackend) -> int:
    """The host pid of the process that runs the runtime's guests."""
    worker = getattr(rt, "worker", None)
    if worker is None:
        return os.getpid()  # no worker: guests run in the node process itself
    pid = worker.guest_host_pid()
    assert pid is not None
    return int(pid)


def proc_cgroups(pid: int) -> dict[str, str]:
    """controller -> path of ``pid``'s cgroups (v1)."""
    found = {}
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(","):
            found[controller] = path
    return found


def proc_status(pid: int) -> dict[str, str]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return fields


@pytest.fixture(scope="module", autouse=True)
def node_secret() -> Any:
    """The node holds the Redis URL in its environment, as ``corral node`` does."""
    saved = os.environ.get("CORRAL_REDIS_URL")
    os.environ["CORRAL_REDIS_URL"] = REDIS_SECRET
    yield
    if saved is None:
        os.environ.pop("CORRAL_REDIS_URL", None)
    else:
        os.environ["CORRAL_REDIS_URL"] = saved


# --- the process around the guests -----------------------------------------------------
async def test_guests_run_in_an_unprivileged_jailed_worker(runtime: WasmBackend) -> None:
    pid = guest_process(runtime)
    assert pid != os.getpid(), "guests run inside the node process"
    environ = Path(f"/proc/{pid}/environ").read_bytes()  # noqa: ASYNC240
    assert REDIS_SECRET.encode() not in environ and b"CORRAL_" not in environ
    status = proc_status(pid)
    assert status["Uid"].split() == [str(EXPECTED_UID)] * 4
    assert status["Gid"].split() == [str(EXPECTED_UID)] * 4
    assert status["Groups"] == ""
    assert int(status["CapEff"], 16) == 0 and int(status["CapPrm"], 16) == 0
    assert status["NoNewPrivs"] == "1"
    assert status["Seccomp"] == "2"
    # its own cgroup, with the memory and pids limits the kernel enforces
    cgroups = proc_cgroups(pid)
    memory_group = Path("/sys/fs/cgroup/memory") / cgroups["memory"].lstrip("/")
    limit = int((memory_group / "memory.limit_in_bytes").read_text())
    assert limit == runtime.config.worker_memory_mb * 1024 * 1024
    pids_group = Path("/sys/fs/cgroup/pids") / cgroups["pids"].lstrip("/")
    assert int((pids_group / "pids.max").read_text()) == runtime.config.worker_pids
    cpu_group = Path("/sys/fs/cgroup/cpu") / cgroups["cpu"].lstrip("/")
    quota_ms = int((cpu_group / "cpu.cfs_quota_us").read_text()) // 1000
    assert 0 < quota_ms < (os.cpu_count() or 1) * 1000  # busy guests leave the node a share
    # it cannot see the node's files: its root is a jail of its own
    assert os.stat(f"/proc/{pid}/root").st_ino != os.stat("/").st_ino


async def test_guest_sees_no_host_environment(runtime: WasmBackend, run: RunFn) -> None:
    result = await run(runtime, "import os\nprint(dict(os.environ))")
    assert result.run is not None and result.run.ok, result.run
    assert result.run.stdout == "{}\n"


async def test_files_beyond_the_preopen_are_unreachable(
    new_runtime: Callable[..., WasmBackend], run: RunFn, wasm_data_dir: Path
) -> None:
    rt = new_runtime(languages=["wasm-python"], warm_per_language=1, writable_workdir=True)
    await rt.start()
    cache = wasm_data_dir / "wasm" / "cache"
    code = (
        "import os\n"
        f"targets = ['..', '/', '/work/..', '/work/../..', '/etc/passwd', '/proc/self/environ',"
        f" '/proc/1/environ', '{cache}', '{cache}/key', '../../../../../etc/shadow']\n"
        "for p in targets:\n"
        "    try:\n"
        "        if os.path.isdir(p) and p not in ('/work/..',):\n"
        "            print(p, 'LISTED', os.listdir(p)[:3])\n"
        "        else:\n"
        "            print(p, 'READ', open(p, 'rb').read(20))\n"
        "    except OSError as e:\n"
        "        print(p, 'refused')\n"
        "for target in ('/etc/passwd', '..', '/'):\n"
        "    try:\n"
        "        os.symlink(target, 'link')\n"
        "        print('symlink', target, open('link', 'rb').read(10))\n"
        "    except OSError:\n"
        "        print('symlink', target, 'refused')\n"
        "    finally:\n"
        "        try:\n            os.unlink('link')\n        except OSError:\n            pass\n"
    )
    try:
        result = await run(rt, code)
    finally:
        await rt.close()
    assert result.run is not None and result.run.ok, result.run
    lines = result.run.stdout.splitlines()
    leaked = [line for line in lines if "refused" not in line and "LISTED ['main.py']" not in line]
    # '/' and '..' resolve to the preopen itself at most (it holds main.py): nothing else
    assert leaked == [], leaked


async def test_threads_are_refused(runtime: WasmBackend, run_module: RunFn) -> None:
    shared = wat('(memory (export "memory") 1 1 shared) (func (export "_start"))')
    result = await run_module(runtime, shared)
    assert result.error is None
    assert result.run is not None and result.run.status is StageStatus.ERROR, result.run
    spawn = wat(
        '(import "wasi" "thread-spawn" (func $spawn (param i32) (result i32)))'
        '(memory (export "memory") 1)'
        '(func (export "_start") (drop (call $spawn (i32.const 0))))'
    )
    result = await run_module(runtime, spawn)
    assert result.run is not None and result.run.status is StageStatus.ERROR, result.run
    assert result.run.message and "thread-spawn" in result.run.message


async def test_huge_declarations_are_refused(runtime: WasmBackend, run_module: RunFn) -> None:
    memory = wat('(memory (export "memory") 65536) (func (export "_start"))')  # 4 GiB
    result = await run_module(runtime, memory, memory_mb=64)
    assert result.run is not None and result.run.status is StageStatus.MEMORY_LIMIT, result.run
    table = wat('(table 50000000 funcref) (func (export "_start"))')
    result = await run_module(runtime, table)
    assert result.run is not None and result.run.status is StageStatus.ERROR, result.run
    assert result.error is None


# --- compiling uploads ------------------------------------------------------------------
async def test_a_huge_module_is_compiled_under_its_limits_beside_other_tenants(
    runtime: WasmBackend, run_module: RunFn
) -> None:
    # Twice the usual size: several seconds of compiling even on a fast machine, so that
    # its 2 s deadline falls well after a small module's compile jail has done (0.6-0.7 s
    # on a slow one; a 0.5 s deadline came first there).
    big = huge_module(40000)
    order: list[str] = []

    async def tracked(name: str, module: bytes, **limits: Any) -> Any:
        result = await run_module(runtime, module, **limits)
        order.append(name)
        return result

    slow, small = await asyncio.gather(
        tracked("huge", big, compile_timeout_s=2.0),
        tracked("small", print_module("other tenant")),
    )
    assert small.run is not None and small.run.stdout == "other tenant", small
    # the huge compile was stopped at its own deadline, and the other call did not wait
    assert slow.compile is not None, "the compile is not a stage of its own"
    assert slow.compile.status is StageStatus.TIME_LIMIT, slow.compile
    assert slow.run is None and slow.error is None
    assert order == ["small", "huge"]
    # with time enough it compiles, and the tenant pays for the CPU
    paid = await run_module(runtime, big, compile_timeout_s=60)
    assert paid.compile is not None and paid.compile.status is StageStatus.FINISHED
    assert paid.compile.cpu_ms is not None and paid.compile.cpu_ms > 0
    assert paid.cpu_ms is not None and paid.cpu_ms >= paid.compile.cpu_ms
    assert paid.setup_ms >= paid.compile.wall_ms
    again = await run_module(runtime, big)  # compiled once: the cache serves it
    assert again.compile is None and again.run is not None


async def test_uploads_cannot_evict_the_interpreters(
    new_runtime: Callable[..., WasmBackend], run_module: RunFn, wasm_data_dir: Path
) -> None:
    rt_cache = new_runtime(
        languages=["wasm-python", "wasm"], warm_per_language=0, cache_max_bytes=64 << 20
    )
    await rt_cache.start()
    try:
        fingerprint = rt_cache.engine_fingerprint
        assert fingerprint is not None
        cache = wasm_data_dir / "wasm" / "cache" / fingerprint
        interpreters = [p for p in cache.rglob("*.cwasm") if p.stat().st_size > 20 << 20]
        assert interpreters, "the CPython entry is not in the cache"
        for tag in range(28):  # ~84 MiB of distinct uploads through a 64 MiB cache
            result = await run_module(rt_cache, big_data_module(tag, 3))
            assert result.run is not None and result.run.ok, result
        for path in interpreters:
            assert path.is_file(), f"{path.name} was evicted by uploads"
    finally:
        await rt_cache.close()


# --- the .cwasm cache -------------------------------------------------------------------
def entry_of(cache: Path, sha256: str) -> Path:
    found = list(cache.rglob(f"{sha256}.cwasm"))
    assert found, f"no cache entry for {sha256}"
    return found[0]


async def test_a_planted_cache_entry_is_refused(
    new_runtime: Callable[..., WasmBackend], run_module: RunFn, wasm_data_dir: Path
) -> None:
    import hashlib

    evil, victim = print_module("planted code ran"), print_module("the victim's own")
    rt = new_runtime(languages=["wasm"])
    await rt.start()
    try:
        first = await run_module(rt, evil)
        assert first.run is not None and first.run.stdout == "planted code ran"
        fingerprint = rt.engine_fingerprint
    finally:
        await rt.close()
    assert fingerprint is not None
    cache = wasm_data_dir / "wasm" / "cache" / fingerprint
    source = entry_of(cache, hashlib.sha256(evil).hexdigest())
    target = source.with_name(f"{hashlib.sha256(victim).hexdigest()}.cwasm")
    shutil.copy2(source, target)  # a valid entry, filed under another module's hash
    fresh = new_runtime(languages=["wasm"])
    await fresh.start()
    try:
        result = await run_module(fresh, victim)
    finally:
        await fresh.close()
    assert result.run is not None and result.run.stdout == "the victim's own", result


@pytest.mark.parametrize("tamper", ["world-writable directory", "entry owned by another uid"])
async def test_a_cache_others_can_write_is_not_trusted(
    new_runtime: Callable[..., WasmBackend],
    run_module: RunFn,
    tmp_path: Path,
    tamper: str,
) -> None:
    """Even an intact entry is not loaded from a place another user could have changed:
    the module is compiled again."""
    import hashlib

    module = print_module(f"module of {tamper}")
    data_dir = tmp_path / "data"
    rt = new_runtime(languages=["wasm"], data_dir=data_dir)
    await rt.start()
    try:
        first = await run_module(rt, module)
        assert first.compile is not None  # compiled, and now in the cache
        fingerprint = rt.engine_fingerprint
    finally:
        await rt.close()
    assert fingerprint is not None
    entry = entry_of(data_dir / "wasm" / "cache" / fingerprint, hashlib.sha256(module).hexdigest())
    if tamper == "world-writable directory":
        entry.parent.chmod(0o777)
    else:
        os.chown(entry, EXPECTED_UID, EXPECTED_UID)
    fresh = new_runtime(languages=["wasm"], data_dir=data_dir)
    await fresh.start()
    try:
        result = await run_module(fresh, module)
    finally:
        await fresh.close()
    assert result.run is not None and result.run.stdout == f"module of {tamper}", result
    assert result.compile is not None, "an entry others could write was loaded"


# --- memory slots, reused ---------------------------------------------------------------
async def test_a_reused_memory_slot_shows_nothing_of_its_last_call(
    runtime: WasmBackend, run_module: RunFn
) -> None:
    """The pooling allocator reuses memory slots and keeps their pages resident: what a
    call left in memory (past its module's initial image, and grown memory) must read
    as zeros in the next call of the same module or another."""
    body = (
        '(import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))'
        '(memory (export "memory") 2)'
        '(func (export "_start")'
        "  (drop (memory.grow (i32.const 1)))"
        "  (if (i64.ne (i64.load (i32.const 70000)) (i64.const 0))"
        "    (then (call $exit (i32.const 41))))"
        "  (if (i64.ne (i64.load (i32.const 140000)) (i64.const 0))"
        "    (then (call $exit (i32.const 42))))"
        "  (i64.store (i32.const 70000) (i64.const 0x5345435245540001))"
        "  (i64.store (i32.const 140000) (i64.const 0x5345435245540002))"
        "  (call $exit (i32.const 0)))"
    )
    check_then_mark = wat(body)
    other = wat(body + "(global i32 (i32.const 7))")  # another module, the same code
    for module in (check_then_mark, check_then_mark, other, check_then_mark, other) * 4:
        result = await run_module(runtime, module)
        assert result.run is not None and result.run.exit_code == 0, result.run


async def test_a_call_asking_more_memory_than_a_slot_is_refused(
    runtime: WasmBackend, run: RunFn
) -> None:
    limit = runtime.config.pool_max_memory_mb
    result = await run(runtime, "print(1)", memory_mb=limit + 1)
    assert result.run is not None and result.run.status is StageStatus.ERROR, result
    assert result.run.message and f"maximum of {limit} MB" in result.run.message
    assert (await run(runtime, "print(1)", memory_mb=limit)).run.stdout == "1\n"  # type: ignore[union-attr]


# --- a worker that dies -----------------------------------------------------------------
async def test_a_killed_worker_fails_its_calls_and_is_replaced(
    new_runtime: Callable[..., WasmBackend], run: RunFn
) -> None:
    rt = new_runtime(languages=["wasm-python"], warm_per_language=1)
    await rt.start()
    try:
        pid = guest_process(rt)
        assert pid != os.getpid(), "guests run in the node: killing them kills the node"
        busy = asyncio.create_task(run(rt, "while True:\n    pass", run_timeout_s=60.0))
        for _ in range(500):
            if rt.stats()["busy"]:
                break
            await asyncio.sleep(0.01)
        os.kill(pid, signal.SIGKILL)
        result = await busy
        assert result.error is not None and "worker" in result.error, result
        after = await run(rt, "print('still here')")
        assert after.run is not None and after.run.stdout == "still here\n", after
        assert guest_process(rt) != pid
    finally:
        await rt.close()


async def test_a_worker_holding_stuck_guests_is_replaced(
    new_runtime: Callable[..., WasmBackend], run: RunFn
) -> None:
    """A guest blocked in a host call the deadline cannot reach (``select`` with a long
    timeout) is answered at the backstop and its thread stays; once a worker holds
    ``max_stuck_instances`` of them, new calls go to a new worker and the old one (with
    the blocked threads) is closed."""
    rt = new_runtime(
        languages=["wasm-python"], max_stuck_instances=2, host_grace_s=0.5, retire_drain_s=5
    )
    await rt.start()
    try:
        first = guest_process(rt)
        blocked = "import select\nselect.select([], [], [], 120)"
        stuck = await asyncio.gather(*(run(rt, blocked, run_timeout_s=0.3) for _ in range(2)))
        for result in stuck:
            assert result.run is not None and result.run.status is StageStatus.TIME_LIMIT
            assert result.run.message and "abandoned" in result.run.message
        for _ in range(1000):
            if guest_process(rt) != first and not running(first):
                break
            await asyncio.sleep(0.02)
        assert guest_process(rt) != first
        assert not running(first), "the old worker still runs"
        after = await run(rt, "print('fresh')")
        assert after.run is not None and after.run.stdout == "fresh\n", after
    finally:
        await rt.close()


async def test_closing_while_a_worker_is_being_replaced_ends_the_old_one_too(
    new_runtime: Callable[..., WasmBackend], run: RunFn
) -> None:
    """The old worker waits for its running calls before it is closed; a runtime closed
    meanwhile ends it as well, rather than leaving it running."""
    rt = new_runtime(
        languages=["wasm-python"], max_stuck_instances=1, host_grace_s=0.5, retire_drain_s=60
    )
    await rt.start()
    first = guest_process(rt)
    spinning = asyncio.create_task(run(rt, "while True:\n    pass", run_timeout_s=30.0))
    try:
        for _ in range(500):
            if rt.stats()["busy"]:
                break
            await asyncio.sleep(0.01)
        blocked = await run(rt, "import select\nselect.select([], [], [], 120)", run_timeout_s=0.3)
        assert blocked.run is not None and blocked.run.status is StageStatus.TIME_LIMIT
        for _ in range(1000):  # a new worker takes new calls; the old one drains
            if guest_process(rt) != first:
                break
            await asyncio.sleep(0.02)
        assert guest_process(rt) != first and running(first)
    finally:
        await rt.close()
    for _ in range(250):  # killed: gone once its parent (or init) has reaped it
        if not running(first):
            break
        await asyncio.sleep(0.02)
    assert not running(first), "the old worker outlived the runtime"
    result = await spinning
    assert result.run is None or result.run.status is not StageStatus.FINISHED


async def test_a_guest_exiting_ends_only_its_call(
    runtime: WasmBackend, run: RunFn, run_module: RunFn
) -> None:
    before = guest_process(runtime)
    result = await run(runtime, "import os\nos._exit(7)")
    assert result.run is not None and result.run.exit_code == 7
    exit3 = wat(
        '(import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))'
        '(memory (export "memory") 1) (func (export "_start") (call $exit (i32.const 3)))'
    )
    result = await run_module(runtime, exit3)
    assert result.run is not None and result.run.exit_code == 3
    assert guest_process(runtime) == before


# --- time, judged fairly ----------------------------------------------------------------
async def test_cpu_basis_limits_cpu_not_sleep(runtime: WasmBackend, run: RunFn) -> None:
    sleeper = "import time\ntime.sleep(1.5)\nprint('woke')"
    result = await run(runtime, sleeper, run_timeout_s=1.0, time_basis="cpu")
    assert result.run is not None and result.run.ok, result.run  # sleeping is not CPU
    spin = await run(runtime, "while True:\n    pass", run_timeout_s=0.5, time_basis="cpu")
    assert spin.run is not None and spin.run.status is StageStatus.TIME_LIMIT
    assert spin.run.message and "CPU" in spin.run.message
    assert not spin.run.contended  # an exact verdict
    forever = await run(
        runtime, "import time\ntime.sleep(3600)", run_timeout_s=0.5, time_basis="cpu"
    )
    assert forever.run is not None and forever.run.status is StageStatus.TIME_LIMIT
    assert forever.run.message and "wall-clock" in forever.run.message  # the backstop
    assert not forever.run.contended  # it slept: nobody took its CPU


async def test_starved_calls_are_judged_contended_and_the_node_keeps_going(
    runtime: WasmBackend, run_module: RunFn
) -> None:
    spin = wat('(func (export "_start") (loop (br 0)))')
    n = 4 * (os.cpu_count() or 1)
    beats: list[int] = []
    stop = asyncio.Event()

    async def heartbeat() -> None:  # the node agent's report: stats and inventory
        while not stop.is_set():
            beats.append(runtime.stats()["busy"])
            runtime.inventory()
            await asyncio.sleep(0.02)

    beating = asyncio.create_task(heartbeat())
    try:
        results = await asyncio.gather(
            *(run_module(runtime, spin, run_timeout_s=1.0) for _ in range(n))
        )
    finally:
        stop.set()
        await beating
    assert all(r.run is not None and r.run.status is StageStatus.TIME_LIMIT for r in results)
    # n spinning guests on fewer cores: on average under a quarter of a core each, so at
    # least one got under half a core and is reported contended
    assert any(r.run.contended for r in results), [(r.run.cpu_ms, r.run.wall_ms) for r in results]
    for r in results:
        assert r.run.contended == (r.run.cpu_ms < 0.5 * r.run.wall_ms)
    # the node's loop kept reporting while every guest was spinning
    assert n in beats, beats
