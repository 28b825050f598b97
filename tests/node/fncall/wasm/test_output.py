"""``OutputPipes`` and ``PipeCapture`` on real FIFOs, their writer a thread as a guest's is."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from node.fncall.wasm.output import OutputPipes, PipeCapture

pytestmark = pytest.mark.asyncio

CHUNK = b"x" * 4096


@pytest.fixture
def pipes_dir(tmp_path: Path) -> Iterator[Path]:
    """The pipes' dir; the test fails if a FIFO or a descriptor outlives ``close()``."""
    directory = tmp_path / "pipes"
    directory.mkdir()
    descriptors = set(os.listdir("/proc/self/fd"))
    yield directory
    assert list(directory.iterdir()) == []
    assert set(os.listdir("/proc/self/fd")) == descriptors


@pytest.fixture
async def pipes(pipes_dir: Path) -> AsyncIterator[OutputPipes]:
    lender = _pipes(pipes_dir)
    yield lender
    lender.close()


def _borrow(pipes: OutputPipes, limit: int) -> tuple[PipeCapture, int]:
    """A capture armed with ``limit``, and a write end of its pipe, as a Store holds."""
    capture = PipeCapture(pipes)
    capture.arm(limit)
    return capture, _open_write_end(capture)


def _open_write_end(capture: PipeCapture) -> int:
    return os.open(capture.path, os.O_WRONLY | os.O_CLOEXEC)  # the read end is open: no wait


def _writer(fd: int, total: int, errors: list[BaseException]) -> threading.Thread:
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


def _pipes(directory: Path, keep: int = 8) -> OutputPipes:
    return OutputPipes(directory, asyncio.get_running_loop(), keep=keep)


def _finish(capture: PipeCapture, write_end: int) -> None:
    """As an instance ends: collect, dispose, close the Store's write end, release."""
    capture.collect()
    capture.close()
    os.close(write_end)
    capture.release()


async def test_a_writer_of_more_than_the_pipe_holds_is_drained_and_capped(
    pipes: OutputPipes,
) -> None:
    capture = PipeCapture(pipes)
    capture.arm(10_000)
    errors: list[BaseException] = []
    writer = _writer(_open_write_end(capture), 1 << 20, errors)  # 16 pipe buffers
    writer.start()
    await _join(writer)  # the event loop drained it while it wrote
    capture.collect()
    assert errors == []
    assert capture.kept.total == 1 << 20 and capture.truncated
    assert capture.text() == "x" * 10_000
    capture.close()
    capture.release()


async def test_collect_reads_what_the_writer_left_without_waiting_for_it_to_close(
    pipes: OutputPipes,
) -> None:
    capture, fd = _borrow(pipes, 1_000)
    os.write(fd, b"6765\n")
    capture.collect()  # the write end is still open, as a Store's is until it closes
    assert capture.text() == "6765\n" and not capture.truncated
    _finish(capture, fd)


async def test_a_pipe_goes_back_and_its_next_borrower_reads_only_its_own_output(
    pipes: OutputPipes,
) -> None:
    first, fd = _borrow(pipes, 100)
    os.write(fd, b"first\n")
    _finish(first, fd)
    second, fd = _borrow(pipes, 100)
    assert second.path == first.path, "the pipe was not lent again"
    os.write(fd, b"second\n")
    _finish(second, fd)
    assert (first.text(), second.text()) == ("first\n", "second\n")
    assert pipes.open_count == 1 and pipes.retired == 0


async def test_a_pipe_whose_old_write_end_is_still_open_is_never_lent_again(
    pipes: OutputPipes,
) -> None:
    """The guard against mixing two calls' output: a write end that outlived its Store
    could write into the next borrower's output, so such a pipe is retired."""
    first, old = _borrow(pipes, 100)
    first.collect()
    first.close()
    first.release()  # given back, but ``old`` is still open
    second, fd = _borrow(pipes, 100)
    assert second.path != first.path
    assert pipes.retired == 1
    os.write(fd, b"mine\n")
    with pytest.raises(BrokenPipeError):  # the retired pipe has no reader any more
        os.write(old, b"late\n")
    os.close(old)
    _finish(second, fd)
    assert second.text() == "mine\n"


async def test_output_after_the_collect_retires_the_pipe(
    pipes: OutputPipes, caplog: pytest.LogCaptureFixture
) -> None:
    first, fd = _borrow(pipes, 100)
    first.collect()
    os.write(fd, b"late\n")  # after its guest was judged to have returned
    first.close()
    os.close(fd)
    first.release()
    await asyncio.sleep(0.05)  # the loop drains it as stray output
    with caplog.at_level(logging.WARNING, logger="node.fncall.wasm.output"):
        second = PipeCapture(pipes)
    assert second.path != first.path and pipes.retired == 1
    assert "after its guest returned" in caplog.text
    assert first.text() == ""
    second.close()


async def test_a_pipe_not_collected_is_retired_and_unblocks_its_writer_with_epipe(
    pipes: OutputPipes,
) -> None:
    loop = asyncio.get_running_loop()
    capture = PipeCapture(pipes)
    capture.arm(100)
    pipe = capture._pipe
    assert pipe is not None and pipe._fd is not None
    loop.remove_reader(pipe._fd)  # nobody drains: the writer fills the pipe and blocks
    errors: list[BaseException] = []
    writer = _writer(_open_write_end(capture), 1 << 20, errors)
    writer.start()
    await asyncio.sleep(0.2)
    assert writer.is_alive()
    capture.close()  # an abandoned guest: never collected
    await _join(writer)
    assert len(errors) == 1 and isinstance(errors[0], BrokenPipeError)
    capture.close()  # idempotent
    capture.release()  # nothing to give back
    assert pipes.open_count == 0 and not capture.path.exists()


async def test_free_pipes_beyond_the_bound_are_closed(pipes_dir: Path) -> None:
    pipes = _pipes(pipes_dir, keep=1)
    try:
        captures = [PipeCapture(pipes) for _ in range(3)]
        for capture in captures:
            _finish(capture, _open_write_end(capture))
        PipeCapture(pipes).close()  # takes one: the three given back are sorted first
        assert pipes.open_count == 0 and pipes.retired == 2
    finally:
        pipes.close()


async def test_close_closes_pipes_lent_and_free(pipes_dir: Path) -> None:
    pipes = _pipes(pipes_dir)
    lent = PipeCapture(pipes)
    free = PipeCapture(pipes)
    _finish(free, _open_write_end(free))
    assert pipes.open_count == 2
    pipes.close()
    assert pipes.open_count == 0
    lent.close()  # after the pipes' close: nothing left to do


async def test_an_instance_that_cannot_be_built_leaves_no_pipe_behind(pipes_dir: Path) -> None:
    """The instance's FIFOs are borrowed before its WASI context; when that fails (here:
    its work dir is missing, so the preopen is refused), both are retired."""
    from wasmtime import Module, WasmtimeError, wat2wasm

    from node.fncall.wasm.config import MIB, WasmConfig
    from node.fncall.wasm.engine import WasmEngine
    from node.fncall.wasm.instance import CallLimits, Instance, StoreCaps
    from node.fncall.wasm.modules import LoadedModule
    from node.fncall.wasm.threads import GuestThreads
    from node.fncall.wasm.workdir import HostDir

    tmp_path = pipes_dir.parent
    engine = WasmEngine(WasmConfig(data_dir=tmp_path / "data", pooling=False))
    pipes = _pipes(pipes_dir)
    try:
        module = Module(engine.engine, wat2wasm('(module (func (export "_start")))'))
        loaded = LoadedModule("m", "0" * 64, engine.linker.instantiate_pre(module), 0.0)
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
        assert pipes.open_count == 0  # the fixture checks the dir and the descriptors
    finally:
        pipes.close()
        engine.close()


async def test_a_pipe_whose_own_write_end_cannot_be_reopened_is_retired(
    pipes: OutputPipes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the worker's write end its read end would report a hang-up at every turn
    of the loop: such a pipe is closed, not lent."""
    first, fd = _borrow(pipes, 100)
    _finish(first, fd)
    real_open = os.open

    def no_write_end(path: str, flags: int, *args: int) -> int:
        if flags & os.O_WRONLY:
            raise OSError(24, "Too many open files")
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", no_write_end)
    with pytest.raises(OSError):  # a new pipe cannot be made either
        PipeCapture(pipes)
    monkeypatch.undo()
    assert pipes.retired == 1 and pipes.open_count == 0


async def test_a_read_shorter_than_a_chunk_ends_the_drain(
    pipes: OutputPipes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pipe's read returns all it holds up to the size asked: after a short one the
    pipe is empty, and no read is made just to see ``EAGAIN``."""
    from node.fncall.wasm import output

    capture, fd = _borrow(pipes, 100)
    reads: list[str] = []
    real_read = os.read

    def counted(descriptor: int, size: int) -> bytes:
        try:
            data = real_read(descriptor, size)
        except BlockingIOError:
            reads.append("EAGAIN")
            raise
        reads.append(f"{len(data)} bytes")
        return data

    monkeypatch.setattr(output.os, "read", counted)
    os.write(fd, b"hello\n")
    capture.collect()
    assert reads == ["6 bytes"]
    assert capture.text() == "hello\n"
    monkeypatch.undo()
    _finish_after_collect(capture, fd)


def _finish_after_collect(capture: PipeCapture, write_end: int) -> None:
    capture.close()
    os.close(write_end)
    capture.release()
