"""``Instance``'s end of life: the guest's thread closes the Store and goes back to the
pool without waiting for the caller; the rest of the cleanup is done once, by whichever
of that thread and ``dispose`` comes last."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from wasmtime import Module, TrapCode, wat2wasm

from node.fncall.wasm.config import MIB, WasmConfig
from node.fncall.wasm.engine import WasmEngine
from node.fncall.wasm.instance import CallLimits, Instance, StoreCaps
from node.fncall.wasm.modules import LoadedModule
from node.fncall.wasm.output import OutputPipes
from node.fncall.wasm.threads import GuestThreads
from node.fncall.wasm.workdir import HostDir

pytestmark = pytest.mark.asyncio

CAPS = StoreCaps(table_elements=1000, instances=1, tables=1, memories=1)
WRITE_HI = """
  (import "wasi_snapshot_preview1" "fd_write"
    (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 16) "hi")
  (func (export "_start")
    (i32.store (i32.const 0) (i32.const 16))
    (i32.store (i32.const 4) (i32.const 2))
    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8))))
"""
SPIN = '(func (export "_start") (loop br 0))'


@dataclass
class Harness:
    engine: WasmEngine
    threads: GuestThreads
    pipes: OutputPipes
    run_dir: Path
    disposed: list[str]

    def module(self, body: str) -> LoadedModule:
        module = Module(self.engine.engine, wat2wasm(f"(module {body})"))
        return LoadedModule("m", "0" * 64, self.engine.linker.instantiate_pre(module), 0.0)

    def instance(self, body: str, host_dir: HostDir, timeout_s: float = 5.0) -> Instance:
        return Instance(
            self.engine,
            self.module(body),
            argv=["m"],
            host_dir=host_dir,
            caps=CAPS,
            limits=CallLimits(memory_bytes=16 * MIB, timeout_s=timeout_s, max_output=100),
            writable_workdir=False,
            on_dispose=lambda inst: self.disposed.append(inst.id),
            threads=self.threads,
            pipes=self.pipes,
        )


@pytest.fixture
def run_dir(tmp_path: Path) -> Iterator[Path]:
    directory = tmp_path / "run"
    (directory / "pipes").mkdir(parents=True)
    yield directory


@pytest.fixture
async def harness(run_dir: Path) -> AsyncIterator[Harness]:
    engine = WasmEngine(WasmConfig(data_dir=run_dir / "data", pooling=False))
    engine.start()
    threads = GuestThreads()
    pipes = OutputPipes(run_dir / "pipes", asyncio.get_running_loop(), keep=8)
    try:
        yield Harness(engine, threads, pipes, run_dir, [])
    finally:
        assert threads.close(5.0) == []
        pipes.close()
        engine.close()


async def test_the_guest_thread_is_free_before_the_caller_disposes(harness: Harness) -> None:
    inst = harness.instance(WRITE_HI, HostDir.shared_empty(harness.run_dir))
    inst.start()
    outcome = await inst.outcome_future(asyncio.get_running_loop())
    assert outcome.exit_code == 0
    # the caller has not disposed of it yet: its thread has closed the Store and is idle
    assert await asyncio.to_thread(inst.join, 5.0)
    assert harness.threads.stats() == {"threads": 1, "idle": 1}
    assert harness.disposed == []  # the rest waits for the caller
    inst.stdout.collect()
    inst.stderr.collect()
    assert inst.stdout.text() == "hi"
    inst.dispose()
    inst.dispose()
    assert harness.disposed == [inst.id]  # done once, by ``dispose``
    # both pipes went back and are lent again to the next instance
    assert harness.pipes.open_count == 2
    again = harness.instance(WRITE_HI, HostDir.shared_empty(harness.run_dir))
    assert harness.pipes.open_count == 2
    again.dispose()


async def test_disposed_while_running_the_guest_thread_cleans_up_once(harness: Harness) -> None:
    """An abandoned guest: ``dispose`` (twice, as a call's end and the executor's close
    may) leaves the Store to the running guest, whose thread cleans up when it ends."""
    own = HostDir.create(harness.run_dir, "i1")
    inst = harness.instance(SPIN, own, timeout_s=0.3)
    inst.start()
    await asyncio.sleep(0.05)
    inst.dispose()
    inst.dispose()
    assert harness.disposed == []
    assert own.root.exists()  # the guest still runs in its Store and work dir
    outcome = await asyncio.wait_for(inst.outcome_future(asyncio.get_running_loop()), 10)
    assert outcome.trap_code == TrapCode.INTERRUPT
    assert await asyncio.to_thread(inst.join, 5.0)
    assert harness.disposed == [inst.id]
    assert not own.root.exists()
    assert harness.pipes.open_count == 0  # never collected: retired at dispose


async def test_an_own_host_dir_is_removed_off_the_loop(harness: Harness) -> None:
    own = HostDir.create(harness.run_dir, "i2")
    inst = harness.instance(WRITE_HI, own)
    inst.start()
    await inst.outcome_future(asyncio.get_running_loop())
    assert await asyncio.to_thread(inst.join, 5.0)
    inst.stdout.collect()
    inst.stderr.collect()
    inst.dispose()
    for _ in range(200):  # a guest thread deletes it
        if not own.root.exists():
            break
        await asyncio.sleep(0.01)
    assert not own.root.exists()
    assert harness.disposed == [inst.id]
