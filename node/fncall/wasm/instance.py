"""One instance of a module: its Store, its WASI context and the thread running ``_start``.

An instance serves exactly one call and is then disposed of, so calls never share memory,
globals, anything writable or descriptors. Its life:

1. ``Instance(...)`` builds the Store (limits, epoch deadline, fuel) and the WASI context:
   argv, an empty environment, stdin (a FIFO for warm instances, the call's bytes for
   fresh ones), bounded stdout/stderr captures, and the work dir preopened as ``/work``
   and ``.`` (the instance's own, or the shared read-only empty one: ``workdir``).
   Nothing else of the host is visible.
2. ``start()`` runs ``_start`` on a thread of its own (wasm runs with the GIL released):
   one of the executor's ``GuestThreads``, kept between instances. A warm instance's
   bootstrap writes the ready marker and blocks reading stdin. A
   component (the pre-initialised Python) is always fresh: its ``run`` export is called
   with the call's ``source`` and returns the exit status.
3. ``arm(limits)`` sets the call's memory cap, fuel and epoch deadline. For a warm
   instance this happens while its thread is parked in that blocking read (a host call,
   so no wasm runs and nothing else touches those Store fields); the pipe write that
   wakes it comes after.
4. The guest ends with an exit code, a trap or an error, recorded as an ``Outcome``.
   Its thread then closes the Store (off the caller's path) and goes back to the pool
   without waiting for the caller. The rest of the cleanup (a fresh instance's output
   pipes given back to be lent again, the host dir deleted) must wait until the caller
   has read the output and the files and called ``dispose()``, and the Store is closed:
   whichever of the two comes last does it. Waiting for the caller on the guest's
   thread instead cost each call a wake-up of that thread and its taking of the GIL
   back (docs/benchmarks-history.md, "The GIL kept across wasmtime's short calls").
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from wasmtime import ExitTrap, Func, Memory, Store, Trap, TrapCode, WasiConfig, WasmtimeError
from wasmtime import Instance as WasmInstance

from node.fncall.wasm import epoch, hostcalls
from node.fncall.wasm.engine import WasmEngine
from node.fncall.wasm.modules import LoadedModule
from node.fncall.wasm.output import Capture, OutputCapture, OutputPipes, PipeCapture
from node.fncall.wasm.stdin import PipeFeeder, open_fifo, set_stdin_bytes
from node.fncall.wasm.threads import GuestThreads
from node.fncall.wasm.workdir import HostDir

log = logging.getLogger(__name__)

_ids = itertools.count(1)

#: Fuel while a warm instance starts up (its epoch deadline bounds it anyway).
WARMUP_FUEL = 1 << 50


@dataclass(frozen=True)
class StoreCaps:
    """Store limits that do not change per call."""

    table_elements: int
    instances: int
    tables: int
    memories: int


@dataclass(frozen=True)
class CallLimits:
    """``timeout_s`` limits wall time, or with ``cpu_basis`` the guest thread's CPU time,
    and then ``wall_s`` (``RunLimits.wall_limit``) is the wall-clock backstop."""

    memory_bytes: int
    timeout_s: float
    max_output: int
    fuel: int | None = None
    cpu_basis: bool = False
    wall_s: float | None = None

    @property
    def wall_limit_s(self) -> float:
        return self.wall_s if self.wall_s is not None else self.timeout_s


@dataclass
class Outcome:
    """How the guest's thread ended."""

    exit_code: int | None = None
    trap_code: TrapCode | None = None
    trap: str | None = None  #: short trap or runtime error text
    error: str | None = None  #: could not be instantiated
    memory_bytes: int | None = None  #: final (= peak) size of the exported memory
    cpu_ms: float | None = None
    cancelled: bool = False  #: aborted by the host (close)
    limit_hit: str | None = None  #: "cpu" or "wall": the epoch callback stopped it
    slept_ms: float = 0.0  #: time the guest spent in sleeps it asked for


def _resolve(future: asyncio.Future[Outcome], outcome: Outcome | None) -> None:
    if not future.done() and outcome is not None:
        future.set_result(outcome)


def trap_summary(exc: BaseException) -> str:
    """The cause of a wasmtime error without its wasm backtrace."""
    text = str(exc)
    if "Caused by:" in text:
        text = text.rsplit("Caused by:", 1)[1]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return " ".join(lines)[:500] or type(exc).__name__


#: Trap texts (wasmtime's ``Trap`` display) whose code the guest's outcome depends on.
_TRAP_TEXTS = {
    "wasm trap: interrupt": TrapCode.INTERRUPT,
    "all fuel consumed": TrapCode.OUT_OF_FUEL,
}


def _trap_code_in(text: str) -> TrapCode | None:
    for marker, code in _TRAP_TEXTS.items():
        if marker in text:
            return code
    return None


class Instance:
    def __init__(
        self,
        engine: WasmEngine,
        module: LoadedModule,
        *,
        argv: list[str],
        host_dir: HostDir,
        caps: StoreCaps,
        limits: CallLimits,
        writable_workdir: bool,
        ready_marker: bytes | None = None,
        stdin_data: bytes | None = None,
        source: str | None = None,
        on_dispose: Callable[[Instance], None] | None = None,
        threads: GuestThreads,
        pipes: OutputPipes | None,
    ) -> None:
        """A warm instance has a ``ready_marker`` (stdin is a FIFO); a fresh one gets
        ``stdin_data`` (in memory) and is armed with ``limits`` from the start;
        a component's ``run`` gets ``source``. The guest runs on one of ``threads``. A
        fresh instance's output goes through two FIFOs borrowed from ``pipes`` (so it is
        built on the event loop's thread, which drains them); a warm one's through
        callbacks."""
        self.id = f"{module.name}-{next(_ids)}"
        self._source = source
        self.engine = engine
        self.module = module
        self.host_dir = host_dir
        self._caps = caps
        self.clock = hostcalls.GuestClock(tick_s=engine.tick_s, epoch=lambda: engine.epoch)
        #: how the guest ended, set (on its thread) before the done callbacks run
        self.outcome: Outcome | None = None
        self._ready = False  #: under ``_cb_lock``, as ``_done`` and the callback lists
        self._done = False
        self._ready_callbacks: list[Callable[[Instance], None]] = []
        self._done_callbacks: list[Callable[[Instance], None]] = []
        self._cb_lock = threading.Lock()
        self._threads = threads
        self._started = False
        self._ident: int | None = None  #: the guest thread's, once it runs
        self._finished = threading.Event()  #: the guest thread is done with this instance
        self._cpu_base: float | None = None
        self._start_cpu = 0.0
        self._epoch_callback: object | None = None  #: keeps the ctypes callback alive
        self._limit_hit: str | None = None
        self._disposed = False
        self._released = False  #: ``dispose`` was called
        self._sides_done = 0  #: of the guest's thread (Store closed) and ``dispose``
        self._on_dispose = on_dispose
        self.armed_limits: CallLimits | None = None

        self.stdout: Capture
        self.stderr: Capture
        self.feeder: PipeFeeder | None = None
        if ready_marker is None:
            if pipes is None:
                raise ValueError("a fresh instance needs output pipes")
            self.stdout = PipeCapture(pipes)
            try:
                self.stderr = PipeCapture(pipes)
            except BaseException:
                self.stdout.close()
                raise
        else:
            self.stdout = OutputCapture()
            self.stderr = OutputCapture(marker=ready_marker, on_marker=self._on_ready)
        store: Store | None = None
        try:
            if ready_marker is not None:
                self.feeder = PipeFeeder(open_fifo(host_dir.stdin))
            self.store = store = Store(engine.engine)
            store.set_wasi(self._wasi_config(argv, writable_workdir, stdin_data or b""))
            if ready_marker is None:
                self.arm(limits)
            else:
                self._apply(limits, fuel=WARMUP_FUEL if engine.fuel_per_call else None)
        except BaseException:
            if self.feeder is not None:
                self.feeder.close()
            self.stdout.close()
            self.stderr.close()
            if store is not None:
                store.close()
            raise

    def _wasi_config(self, argv: list[str], writable_workdir: bool, stdin: bytes) -> WasiConfig:
        """argv, no environment, our stdin/stdout/stderr, and only the work dir."""
        wasi = WasiConfig()
        wasi.argv = argv
        wasi.env = []
        if self.feeder is not None:
            wasi.stdin_file = str(self.host_dir.stdin)
        else:
            set_stdin_bytes(wasi, stdin)
        out, err = self.stdout, self.stderr
        if isinstance(out, PipeCapture) and isinstance(err, PipeCapture):
            wasi.stdout_file = str(out.path)  # WASI opens the FIFOs' write ends here
            wasi.stderr_file = str(err.path)
        else:
            assert isinstance(out, OutputCapture) and isinstance(err, OutputCapture)
            wasi.stdout_custom = out
            wasi.stderr_custom = err
        work = str(self.host_dir.work)
        wasi.preopen_dir(work, "/work", writable_workdir)
        wasi.preopen_dir(work, ".", writable_workdir)
        return wasi

    # --- callbacks ----------------------------------------------------------------------
    # Plain flags under a lock, not ``threading.Event``s, and no ``concurrent.futures``
    # future for the outcome: nobody blocks on them, and each of those costs a Condition
    # per instance (docs/benchmarks-history.md, "Lighter instances, the transport's frames
    # together, a parametrised route found by prefix").
    @property
    def done(self) -> bool:
        """The guest has ended (``outcome`` is set)."""
        return self._done

    def on_ready(self, callback: Callable[[Instance], None]) -> None:
        """Call ``callback`` once a warm instance is ready (now if it is)."""
        with self._cb_lock:
            if not self._ready:
                self._ready_callbacks.append(callback)
                return
        callback(self)

    def on_done(self, callback: Callable[[Instance], None]) -> None:
        """Call ``callback`` once the guest has ended (now if it has), on the thread that
        sees it end: the guest's, or the caller's."""
        with self._cb_lock:
            if not self._done:
                self._done_callbacks.append(callback)
                return
        callback(self)

    def outcome_future(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future[Outcome]:
        """A future of ``loop`` that the guest's outcome resolves."""
        future: asyncio.Future[Outcome] = loop.create_future()

        def settle(inst: Instance) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed
                loop.call_soon_threadsafe(_resolve, future, inst.outcome)

        self.on_done(settle)
        return future

    def _fire(self, callbacks: list[Callable[[Instance], None]]) -> None:
        for cb in callbacks:
            try:
                cb(self)
            except Exception:
                log.exception("wasm instance %s: callback failed", self.id)

    def _on_ready(self) -> None:
        with self._cb_lock:
            self._ready = True
            pending, self._ready_callbacks = self._ready_callbacks, []
        self._fire(pending)

    # --- limits -------------------------------------------------------------------------
    def _apply(self, limits: CallLimits, *, fuel: int | None) -> None:
        caps = self._caps
        self.store.set_limits(
            memory_size=limits.memory_bytes,
            table_elements=caps.table_elements,
            instances=caps.instances,
            tables=caps.tables,
            memories=caps.memories,
        )
        if fuel is not None:
            self.store.set_fuel(fuel)
        wall_s = limits.wall_limit_s
        ticks = self.engine.ticks_for(wall_s)
        self.clock.deadline = time.monotonic() + wall_s
        self.clock.deadline_epoch = self.engine.epoch + ticks
        if limits.cpu_basis:
            # the callback runs on the guest's thread at each tick it spends running wasm
            self._epoch_callback = epoch.install(self.store, self._check_time)
            self.store.set_epoch_deadline(1)
        else:
            self.store.set_epoch_deadline(ticks)

    def _check_time(self) -> str | None:
        """On the guest thread, once per epoch tick while it runs wasm (CPU basis): which
        limit it has reached, if any."""
        limits = self.armed_limits
        if limits is None:
            return None
        base = self._cpu_base if self._cpu_base is not None else self._start_cpu
        if time.thread_time() - base >= limits.timeout_s:
            self._limit_hit = "cpu"
        elif time.monotonic() >= self.clock.deadline:
            self._limit_hit = "wall"
        return self._limit_hit

    def arm(self, limits: CallLimits) -> None:
        """Give the instance its call's limits and start keeping its output."""
        self.armed_limits = limits
        ident = self._ident
        if ident is not None and not self._done:
            try:
                self._cpu_base = time.clock_gettime(time.pthread_getcpuclockid(ident))
            except OSError:
                self._cpu_base = None
        self.stdout.arm(limits.max_output)
        self.stderr.arm(limits.max_output)
        self.clock.slept_s = 0.0
        self._apply(limits, fuel=limits.fuel)

    def feed(self, payload: bytes, loop: asyncio.AbstractEventLoop) -> None:
        """Send the call's frame to a warm instance (from the event loop thread)."""
        if self.feeder is None:
            raise RuntimeError(f"instance {self.id} has no stdin pipe")
        self.feeder.feed(payload, loop)

    # --- the guest thread ---------------------------------------------------------------
    def start(self) -> None:
        self._started = True
        self._threads.run(self._main)

    def _main(self) -> None:
        self._ident = threading.get_ident()
        try:
            self._run_guest()
        finally:
            try:
                self.store.close()  # unmaps memory, closes the guest's output write ends
                if self._side_done():  # ``dispose`` came first: the rest is this thread's
                    self._cleanup()
            finally:
                self._finished.set()

    def _run_guest(self) -> None:
        hostcalls.bind(self.clock)
        start_cpu = self._start_cpu = time.thread_time()
        outcome = Outcome()
        instantiated = False
        core: WasmInstance | None = None  # a core module's instance: its memory is read
        try:
            component = self.module.component
            if component is not None:
                instance = self.engine.component_linker.instantiate(self.store, component)
                instantiated = True
                run = instance.get_func(self.store, "run")
                if run is None:
                    raise WasmtimeError("the component exports no run function")
                outcome.exit_code = int(run(self.store, self._source or ""))
            else:
                assert self.module.pre is not None
                core = self.module.pre.instantiate(self.store)
                instantiated = True
                entry = core.exports(self.store)["_start"]
                if not isinstance(entry, Func):
                    raise WasmtimeError("_start is not a function")
                entry(self.store)
                outcome.exit_code = 0
        except ExitTrap as exc:
            outcome.exit_code = exc.code
        except Trap as exc:
            outcome.trap_code = exc.trap_code
            outcome.trap = trap_summary(exc)
        except WasmtimeError as exc:
            if not instantiated:
                outcome.error = trap_summary(exc)
            else:
                outcome.trap = trap_summary(exc)
                # a component's traps arrive as errors: their code is only in the text
                outcome.trap_code = _trap_code_in(str(exc))
        except Exception as exc:  # a wasmtime-py failure, not the guest's
            log.exception("wasm instance %s: unexpected error", self.id)
            outcome.error = f"{type(exc).__name__}: {exc}"
        finally:
            hostcalls.unbind()
            base = self._cpu_base if self._cpu_base is not None else start_cpu
            outcome.cpu_ms = max(0.0, (time.thread_time() - base) * 1000)
            outcome.cancelled = self.clock.cancel.is_set()
            outcome.limit_hit = self._limit_hit
            outcome.slept_ms = self.clock.slept_s * 1000
            if core is not None:
                try:
                    memory = core.exports(self.store).get("memory")
                    if isinstance(memory, Memory):
                        outcome.memory_bytes = memory.data_len(self.store)
                except Exception:
                    pass
            with self._cb_lock:
                self.outcome = outcome
                self._done = True
                pending, self._done_callbacks = self._done_callbacks, []
            self._fire(pending)

    # --- ending -------------------------------------------------------------------------
    def abort(self) -> None:
        """Ask the guest to stop: wake its sleeps, end its stdin. The caller interrupts
        running wasm with ``WasmEngine.interrupt_all``. Safe from any thread."""
        self.clock.cancel.set()
        self.clock.deadline = 0.0
        if self.feeder is not None:
            self.feeder.close()

    def join(self, timeout: float | None = None) -> bool:
        """Wait until the guest's thread is done with this instance (True)."""
        if self._started:
            return self._finished.wait(timeout)
        return True

    @property
    def started(self) -> bool:
        return self._started

    def dispose(self) -> None:
        """Release the instance (the caller has read what it needs). Stops feeding stdin at
        once and closes the output pipes' read ends unless they were collected (a guest
        still writing gets ``EPIPE``), so call it from the event loop thread of a call.
        The rest of the cleanup happens now if the guest's thread has closed the Store (or
        it never started), else when it has. Idempotent, non-blocking."""
        if self.feeder is not None:
            self.feeder.close()
        self.stdout.close()
        self.stderr.close()
        if not self.started:
            self._cleanup()
            return
        with self._cb_lock:
            if self._released:
                return
            self._released = True
        if self._side_done():  # the guest's thread has closed the Store: the rest is ours
            if self.host_dir.shared:
                self._cleanup()
            else:
                self._cleanup_off_loop()

    def _side_done(self) -> bool:
        """Count one of the two sides the cleanup waits for; True for the second."""
        with self._cb_lock:
            self._sides_done += 1
            return self._sides_done == 2

    def _cleanup_off_loop(self) -> None:
        """Deleting an own host dir is file system work: a guest thread does it."""
        try:
            self._threads.run(self._cleanup)
        except RuntimeError:  # the threads are closed (the executor is closing)
            self._cleanup()

    def _cleanup(self) -> None:
        with self._cb_lock:
            if self._disposed:
                return
            self._disposed = True
        if self.feeder is not None:
            self.feeder.close()
        self.store.close()  # done by the guest's thread if it ran (idempotent)
        self.stdout.release()
        self.stderr.release()
        self.host_dir.remove()
        if self._on_dispose is not None:
            self._on_dispose(self)
