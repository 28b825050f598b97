"""An instance's stdin: the call's bytes for a fresh instance, a FIFO for a warm one.

A fresh instance's stdin is the call's bytes, handed to WASI in memory
(``set_stdin_bytes``); with none it reads end-of-file at once.

The host opens the FIFO read-write and non-blocking *before* WASI opens it for reading
(so neither open blocks). The guest's read then blocks until the host writes its frame;
closing the host's descriptor (the only writer) is end-of-file. The feeder writes what the
pipe takes and lets the event loop call it back for the rest, so a guest that never reads
its stdin cannot block a host thread; closing it at the end of the call drops what is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import threading
from pathlib import Path

from wasmtime import WasiConfig
from wasmtime import _ffi as ffi


def set_stdin_bytes(wasi: WasiConfig, data: bytes) -> None:
    """Give the guest ``data`` as its stdin (WASI keeps a copy; nothing is written)."""
    if not data:
        return  # WASI's default stdin: end-of-file
    vec = ffi.wasm_byte_vec_t()
    ffi.wasm_byte_vec_new(  # copies the bytes
        ctypes.byref(vec), len(data), (ffi.wasm_byte_t * len(data)).from_buffer_copy(data)
    )
    ffi.wasi_config_set_stdin_bytes(wasi.ptr(), ctypes.byref(vec))  # owns the vector now


def open_fifo(path: Path) -> int:
    """Create the FIFO at ``path`` and return the host's (writer) descriptor."""
    os.mkfifo(path, 0o600)
    return os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)


class PipeFeeder:
    """Writes one payload into a non-blocking pipe descriptor it owns, then closes it."""

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd
        self._lock = threading.Lock()
        self._data = memoryview(b"")
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def closed(self) -> bool:
        return self._fd is None

    def feed(self, payload: bytes, loop: asyncio.AbstractEventLoop) -> None:
        self._data = memoryview(payload)
        self._write()
        if self._fd is not None:
            self._loop = loop
            loop.add_writer(self._fd, self._write)

    def _write(self) -> None:
        fd = self._fd
        if fd is None:
            return
        try:
            while self._data:
                written = os.write(fd, self._data[: 1 << 16])
                self._data = self._data[written:]
        except BlockingIOError:
            return
        except OSError:
            pass
        self.close()

    def close(self) -> None:
        """Stop feeding and close the descriptor (end-of-file for the guest). Idempotent."""
        with self._lock:
            fd, self._fd = self._fd, None
        if fd is None:
            return
        if self._loop is not None:
            with contextlib.suppress(Exception):
                self._loop.remove_writer(fd)
            self._loop = None
        with contextlib.suppress(OSError):
            os.close(fd)
