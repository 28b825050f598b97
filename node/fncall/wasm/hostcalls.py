"""Our own ``poll_oneoff`` and ``clock_time_get``, shadowing wasmtime's WASI versions,
and the ``sleep`` the Python component imports.

Epoch interruption only fires while wasm code runs: a guest sleeping inside a host call
(``time.sleep(3600)`` is one ``poll_oneoff``) would hold its thread past any deadline and
past ``close()``. So sleeps are served here, capped at the call's deadline and woken by its
cancel event; when the deadline has passed the guest gets control back, and the next epoch
check traps it. ``poll_oneoff`` takes absolute deadlines on the guest's monotonic clock, so
that clock is ours too: the host's monotonic clock minus a per-instance origin.

File-descriptor subscriptions are reported ready at once (the only blocking descriptor a
guest has is its stdin pipe, which the host always fills and closes). Clock ids 2 and 3
(process/thread CPU time) read the calling thread's CPU clock: a guest is one thread.

The functions run on the thread that runs the guest, which binds its ``GuestClock`` with
``bind``. Each also notes the size of the guest's linear memory in that clock
(``memory_bytes``): the only moment the host may read it, as wasmtime wants a Store used
by one thread at a time. The interpreters read a clock during their start-up, so a warm
instance's clock holds its memory footprint (measured: all of it for CPython and QuickJS).
They never raise: an exception escaping a wasmtime-py callback is parked in a
process-global slot and could surface in another thread's call.
"""

from __future__ import annotations

import logging
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from wasmtime import Caller, FuncType, Linker, Memory, ValType
from wasmtime.component import Linker as ComponentLinker

log = logging.getLogger(__name__)

WASI = "wasi_snapshot_preview1"

U32 = 0xFFFF_FFFF

ERRNO_SUCCESS = 0
ERRNO_FAULT = 21
ERRNO_INVAL = 28

CLOCK_REALTIME = 0
CLOCK_MONOTONIC = 1
CLOCK_PROCESS_CPUTIME = 2
CLOCK_THREAD_CPUTIME = 3

EVENTTYPE_CLOCK = 0
EVENTTYPE_FD_READ = 1
EVENTTYPE_FD_WRITE = 2
SUBCLOCKFLAG_ABSTIME = 1

SUBSCRIPTION = struct.Struct("<QB7xIxxxxQQH6x")  # userdata, tag, id/fd, timeout, precision, flags
EVENT = struct.Struct("<QHB5xQH6x")  # userdata, error, type, nbytes, flags
assert SUBSCRIPTION.size == 48 and EVENT.size == 32

#: Longest single sleep; a guest without a bound clock is never parked for longer.
MAX_UNBOUND_SLEEP_S = 0.05


def _no_epoch() -> int:
    return 0


@dataclass
class GuestClock:
    """Per-instance time state, shared by the host thread and the guest's thread."""

    origin_ns: int = field(default_factory=time.monotonic_ns)
    deadline: float = field(default_factory=time.monotonic)  #: host monotonic seconds
    #: the store's epoch deadline and a reading of the engine's epoch
    deadline_epoch: int = 0
    epoch: Callable[[], int] = _no_epoch
    cancel: threading.Event = field(default_factory=threading.Event)
    tick_s: float = 0.01
    #: size of the guest's linear memory at its latest clock or poll call
    memory_bytes: int = 0
    #: time spent in sleeps the guest asked for (poll_oneoff timers)
    slept_s: float = 0.0


_local = threading.local()


def bind(clock: GuestClock) -> None:
    _local.clock = clock


def unbind() -> None:
    _local.clock = None


def _bound() -> GuestClock | None:
    clock: GuestClock | None = getattr(_local, "clock", None)
    return clock


def _memory(caller: Caller) -> Memory | None:
    mem = caller.get("memory")
    return mem if isinstance(mem, Memory) else None


def _now_ns(clock_id: int, origin_ns: int) -> int | None:
    if clock_id == CLOCK_REALTIME:
        return time.time_ns()
    if clock_id == CLOCK_MONOTONIC:
        return time.monotonic_ns() - origin_ns
    if clock_id in (CLOCK_PROCESS_CPUTIME, CLOCK_THREAD_CPUTIME):
        return time.thread_time_ns()
    return None


def clock_time_get(caller: Caller, clock_id: int, _precision: int, out_ptr: int) -> int:
    try:
        clock = _bound()
        now = _now_ns(clock_id, clock.origin_ns if clock else 0)
        if now is None:
            return ERRNO_INVAL
        mem = _memory(caller)
        out_ptr &= U32
        size = mem.data_len(caller) if mem is not None else 0
        if clock is not None:
            clock.memory_bytes = size
        if mem is None or out_ptr + 8 > size:
            return ERRNO_FAULT
        mem.write(caller, struct.pack("<Q", now & 0xFFFF_FFFF_FFFF_FFFF), out_ptr)
        return ERRNO_SUCCESS
    except Exception:
        log.exception("wasm clock_time_get failed")
        return ERRNO_FAULT


def poll_oneoff(caller: Caller, in_ptr: int, out_ptr: int, nsubs: int, nevents_ptr: int) -> int:
    try:
        return _poll_oneoff(caller, in_ptr, out_ptr, nsubs, nevents_ptr)
    except Exception:
        log.exception("wasm poll_oneoff failed")
        return ERRNO_FAULT


def _poll_oneoff(caller: Caller, in_ptr: int, out_ptr: int, nsubs: int, nevents_ptr: int) -> int:
    in_ptr, out_ptr, nsubs, nevents_ptr = (v & U32 for v in (in_ptr, out_ptr, nsubs, nevents_ptr))
    if nsubs == 0:
        return ERRNO_INVAL
    mem = _memory(caller)
    if mem is None:
        return ERRNO_FAULT
    size = mem.data_len(caller)
    clock = _bound()
    if clock is not None:
        clock.memory_bytes = size
    in_end = in_ptr + nsubs * SUBSCRIPTION.size
    out_end = out_ptr + nsubs * EVENT.size
    if max(in_end, out_end, nevents_ptr + 4) > size:
        return ERRNO_FAULT
    raw = bytes(mem.read(caller, in_ptr, in_end))
    origin = clock.origin_ns if clock else 0
    ready: list[bytes] = []
    timers: list[tuple[float, int]] = []  # (host monotonic wake-up, userdata)
    now = time.monotonic()
    for i in range(nsubs):
        userdata, tag, ident, timeout, _precision, flags = SUBSCRIPTION.unpack_from(
            raw, i * SUBSCRIPTION.size
        )
        if tag in (EVENTTYPE_FD_READ, EVENTTYPE_FD_WRITE):
            ready.append(EVENT.pack(userdata, ERRNO_SUCCESS, tag, 0, 0))
        elif tag == EVENTTYPE_CLOCK:
            current = _now_ns(ident, origin)
            if current is None:
                ready.append(EVENT.pack(userdata, ERRNO_INVAL, tag, 0, 0))
                continue
            remaining_ns = timeout - current if flags & SUBCLOCKFLAG_ABSTIME else timeout
            timers.append((now + max(0, remaining_ns) / 1e9, userdata))
        else:
            ready.append(EVENT.pack(userdata, ERRNO_INVAL, tag, 0, 0))
    if not ready:
        wake, userdata = min(timers)
        _sleep_until(wake, clock)
        ready.append(EVENT.pack(userdata, ERRNO_SUCCESS, EVENTTYPE_CLOCK, 0, 0))
    mem.write(caller, b"".join(ready), out_ptr)
    mem.write(caller, struct.pack("<I", len(ready)), nevents_ptr)
    return ERRNO_SUCCESS


def _sleep_until(wake: float, clock: GuestClock | None) -> None:
    """Sleep towards ``wake``, never past the call's deadline, returning early on cancel.

    A sleep that would outlast the deadline ends only once the engine's epoch has reached
    the store's epoch deadline, so the guest's next epoch check traps: it never sees a
    sleep cut short.
    """
    now = time.monotonic()
    if clock is None:
        time.sleep(min(max(0.0, wake - now), MAX_UNBOUND_SLEEP_S))
        return
    try:
        delay = min(wake, clock.deadline) - now
        if delay > 0 and clock.cancel.wait(delay):
            return
        if wake <= clock.deadline:
            return
        while clock.epoch() < clock.deadline_epoch and not clock.cancel.wait(clock.tick_s):
            pass
    finally:
        clock.slept_s += time.monotonic() - now


def component_sleep(_store: object, nanos: int) -> None:
    """The ``sleep`` import of the pre-initialised Python component
    (``node.fncall.wasm.pycomponent``): the same capped, cancellable sleep."""
    try:
        _sleep_until(time.monotonic() + max(0, nanos) / 1e9, _bound())
    except Exception:
        log.exception("wasm sleep failed")


def install_component(linker: ComponentLinker) -> None:
    """Define the component's own imports in ``linker`` (after ``add_wasip2``)."""
    with linker.root() as root:
        root.add_func("sleep", component_sleep)


def install(linker: Linker) -> None:
    """Shadow the WASI clock and poll functions in ``linker`` (after ``define_wasi``)."""
    i32, i64 = ValType.i32(), ValType.i64()
    linker.allow_shadowing = True
    linker.define_func(
        WASI, "clock_time_get", FuncType([i32, i64, i32], [i32]), clock_time_get, True
    )
    linker.define_func(
        WASI, "poll_oneoff", FuncType([i32, i32, i32, i32], [i32]), poll_oneoff, True
    )
    linker.allow_shadowing = False
