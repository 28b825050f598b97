"""``PipeCapture`` on a real FIFO, its writer a thread as a guest's is."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest

from runtimes.wasm.output import PipeCapture

pytestmark = pytest.mark.asyncio

CHUNK = b"x" * 4096


def _writer(path: Path, total: int, errors: list[BaseException]) -> threading.Thread:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)  # the read end is open: no wait

    def write() -> None:
        try:
            left = total
            while left > 0:
                left -= os.write(fd, CHUNK[: min(left, len(CHUNK))])
        except BaseException as exc:  # the test reads it
            errors.append(exc)
        finally:
            os.close(fd)

    return threading.Thread(target=write, name="fake-guest")


async def _join(thread: threading.Thread) -> None:
    await asyncio.to_thread(thread.join, 10)
    assert not thread.is_alive(), "the writer is still blocked"


async def test_a_writer_of_more_than_the_pipe_holds_is_drained_and_capped(
    tmp_path: Path,
) -> None:
    capture = PipeCapture(tmp_path, "out", asyncio.get_running_loop())
    capture.arm(10_000)
    errors: list[BaseException] = []
    writer = _writer(capture.path, 1 << 20, errors)  # 16 times a pipe's buffer
    capture.opened()
    assert not capture.path.exists(), "the FIFO's name outlived its two ends"
    writer.start()
    await _join(writer)  # the event loop drained it while it wrote
    capture.collect()
    assert errors == []
    assert capture.kept.total == 1 << 20 and capture.truncated
    assert capture.text() == "x" * 10_000


async def test_collect_reads_what_the_writer_left_without_waiting_for_it_to_close(
    tmp_path: Path,
) -> None:
    capture = PipeCapture(tmp_path, "out", asyncio.get_running_loop())
    capture.arm(1_000)
    fd = os.open(capture.path, os.O_WRONLY)
    try:
        os.write(fd, b"6765\n")
        capture.collect()  # the write end is still open, as a Store's is until it closes
        assert capture.text() == "6765\n" and not capture.truncated
    finally:
        os.close(fd)


async def test_closing_the_read_end_unblocks_a_writer_with_epipe(tmp_path: Path) -> None:
    loop = asyncio.get_running_loop()
    capture = PipeCapture(tmp_path, "out", loop)
    capture.arm(100)
    loop.remove_reader(capture._fd)  # nobody drains: the writer fills the pipe and blocks
    errors: list[BaseException] = []
    writer = _writer(capture.path, 1 << 20, errors)
    writer.start()
    await asyncio.sleep(0.2)
    assert writer.is_alive()
    capture.close()
    await _join(writer)
    assert len(errors) == 1 and isinstance(errors[0], BrokenPipeError)
    capture.close()  # idempotent


async def test_an_instance_that_cannot_be_built_leaves_no_pipe_behind(tmp_path: Path) -> None:
    """The instance's FIFOs are made before its WASI context; when that fails (here: its
    work dir is missing, so the preopen is refused), both are closed and unlinked."""
    from wasmtime import Module, WasmtimeError, wat2wasm

    from runtimes.wasm.config import MIB, WasmConfig
    from runtimes.wasm.engine import WasmEngine
    from runtimes.wasm.instance import CallLimits, Instance, StoreCaps
    from runtimes.wasm.modules import LoadedModule
    from runtimes.wasm.threads import GuestThreads
    from runtimes.wasm.workdir import HostDir

    engine = WasmEngine(WasmConfig(data_dir=tmp_path / "data", pooling=False))
    try:
        module = Module(engine.engine, wat2wasm('(module (func (export "_start")))'))
        loaded = LoadedModule("m", "0" * 64, engine.linker.instantiate_pre(module), 0.0)
        pipes = tmp_path / "pipes"
        pipes.mkdir()
        descriptors = set(os.listdir("/proc/self/fd"))
        with pytest.raises(WasmtimeError):
            Instance(
                engine,
                loaded,
                argv=["m"],
                host_dir=HostDir(tmp_path / "missing"),
                caps=StoreCaps(table_elements=1000, instances=1, tables=1, memories=1),
                limits=CallLimits(memory_bytes=16 * MIB, timeout_s=1.0, max_output=100),
                writable_workdir=False,
                threads=GuestThreads(),
                pipes=pipes,
            )
        assert list(pipes.iterdir()) == []
        assert set(os.listdir("/proc/self/fd")) == descriptors
    finally:
        engine.close()
