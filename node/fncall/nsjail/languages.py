"""The languages the jails run: how to compile and start each, and the per-call stage plan.

Python runs in a fork of the jail's template (an already-initialised interpreter); every
other language is exec'd from one. A language is offered only when all of its binaries
exist on this node.
"""

from __future__ import annotations

import asyncio
import glob
import logging
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from node.fncall.nsjail.config import MIB, NsjailConfig
from wire.execution import RunSpec

logger = logging.getLogger(__name__)

StageName = Literal["compile", "run"]

#: processes of the jail itself that RLIMIT_NPROC counts with the code's: the zygote
#: (PID 1) and the template
JAIL_PROCESSES = 2


@dataclass(frozen=True, slots=True)
class LanguageSpec:
    """One language: files, commands and how its out-of-memory deaths look."""

    name: str
    source_file: str
    #: argv of the run stage; ``{memory_mb}`` and ``{heap_mb}`` are filled in per call
    run_argv: tuple[str, ...] = ()
    compile_argv: tuple[str, ...] | None = None
    #: run the code in the zygote's own interpreter instead of exec'ing run_argv
    inprocess_python: bool = False
    #: RLIMIT_AS for the run/compile stage; runtimes that reserve huge address ranges
    #: (JVM, V8, rustc's LLVM) are bounded by the cgroup instead
    run_rlimit_as: bool = True
    compile_rlimit_as: bool = True
    #: threads the runtime itself starts, granted on top of spec.limits.max_processes
    runtime_threads: int = 0
    binaries: tuple[str, ...] = ()
    version_argv: tuple[str, ...] = ()
    #: stderr text that means the program died for lack of memory
    oom_markers: tuple[str, ...] = ()
    #: extra host paths (globs) bound read-only into this language's jails
    extra_ro_binds: tuple[str, ...] = ()

    @property
    def compiled(self) -> bool:
        return self.compile_argv is not None

    def available(self) -> bool:
        return all(os.access(path, os.X_OK) for path in self.binaries)

    def ro_binds(self) -> list[str]:
        found: list[str] = []
        for pattern in self.extra_ro_binds:
            found.extend(sorted(glob.glob(pattern)))
        return found


PYTHON_SOURCE = "main.py"

BUILTIN: tuple[LanguageSpec, ...] = (
    LanguageSpec(
        name="python",
        source_file=PYTHON_SOURCE,
        inprocess_python=True,
        binaries=("/usr/bin/python3",),
        version_argv=("/usr/bin/python3", "--version"),
        oom_markers=("MemoryError",),
        # bounded by the jail's cgroup alone: running out of it is then an OOM kill the
        # kernel counts, where RLIMIT_AS would make it a MemoryError that the host
        # cannot tell from one the code printed (one big allocation never shows the
        # peak memory that makes the text believable)
        run_rlimit_as=False,
    ),
    LanguageSpec(
        name="cpp",
        source_file="main.cpp",
        compile_argv=("/usr/bin/g++", "-std=c++17", "-O2", "-pipe", "-o", "main", "main.cpp"),
        run_argv=("./main",),
        binaries=("/usr/bin/g++",),
        version_argv=("/usr/bin/g++", "-dumpfullversion"),
        oom_markers=("std::bad_alloc",),
    ),
    LanguageSpec(
        name="rust",
        source_file="main.rs",
        compile_argv=(
            "/usr/bin/rustc",
            "--edition=2021",
            "-O",
            "-C",
            "codegen-units=1",
            "-o",
            "main",
            "main.rs",
        ),
        run_argv=("./main",),
        compile_rlimit_as=False,
        runtime_threads=0,
        binaries=("/usr/bin/rustc", "/usr/bin/cc"),
        version_argv=("/usr/bin/rustc", "--version"),
        oom_markers=("memory allocation of",),
    ),
    LanguageSpec(
        name="java",
        source_file="Main.java",
        compile_argv=(
            "/usr/bin/javac",
            "-J-Xmx{compile_heap_mb}m",
            "-J-XX:+UseSerialGC",
            "-J-XX:TieredStopAtLevel=1",
            "-J-XX:-UsePerfData",
            "-encoding",
            "UTF-8",
            "Main.java",
        ),
        run_argv=(
            "/usr/bin/java",
            "-Xmx{heap_mb}m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-XX:-UsePerfData",
            "-cp",
            ".",
            "Main",
        ),
        run_rlimit_as=False,
        compile_rlimit_as=False,
        runtime_threads=32,
        binaries=("/usr/bin/java", "/usr/bin/javac"),
        version_argv=("/usr/bin/java", "-version"),
        oom_markers=("java.lang.OutOfMemoryError",),
        extra_ro_binds=("/etc/java-*",),
    ),
    LanguageSpec(
        name="nodejs",
        source_file="main.js",
        run_argv=("/usr/bin/node", "--max-old-space-size={heap_mb}", "main.js"),
        run_rlimit_as=False,
        runtime_threads=16,
        binaries=("/usr/bin/node",),
        version_argv=("/usr/bin/node", "--version"),
        oom_markers=("JavaScript heap out of memory",),
    ),
    LanguageSpec(
        name="bash",
        source_file="main.sh",
        run_argv=("/bin/bash", "main.sh"),
        binaries=("/bin/bash",),
        version_argv=("/bin/bash", "--version"),
    ),
    LanguageSpec(
        name="perl",
        source_file="main.pl",
        run_argv=("/usr/bin/perl", "main.pl"),
        binaries=("/usr/bin/perl",),
        version_argv=("/usr/bin/perl", "-e", "print $^V"),
        oom_markers=("Out of memory!",),
    ),
)


def detect(wanted: Iterable[str] | None = None) -> dict[str, LanguageSpec]:
    """The built-in languages available here, optionally narrowed to ``wanted``."""
    names = set(wanted) if wanted is not None else None
    if names is not None:
        unknown = names - {spec.name for spec in BUILTIN}
        if unknown:
            raise ValueError(f"unknown nsjail languages: {sorted(unknown)}")
    found: dict[str, LanguageSpec] = {}
    for spec in BUILTIN:
        if names is not None and spec.name not in names:
            continue
        if spec.available():
            found[spec.name] = spec
        else:
            logger.info("language %s not offered: missing one of %s", spec.name, spec.binaries)
    return found


_VERSION = re.compile(r"\d+\.\d+(?:\.\d+)?")


async def probe_version(spec: LanguageSpec, timeout_s: float = 10.0) -> str | None:
    """Ask the (trusted, host-installed) toolchain for its version; None if that fails."""
    if not spec.version_argv:
        return None
    try:
        proc = await asyncio.create_subprocess_exec(
            *spec.version_argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
        )
    except OSError as exc:
        logger.warning("version probe of %s failed: %s", spec.name, exc)
        return None
    try:
        async with asyncio.timeout(timeout_s):
            out, _ = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return None
    match = _VERSION.search(out.decode(errors="replace"))
    return match.group(0) if match else None


@dataclass(frozen=True, slots=True)
class StagePlan:
    """One stage as the zygote runs it."""

    name: StageName
    argv: tuple[str, ...]
    #: the stage's time limit as asked (wall clock, or CPU time when cpu_limit_s is set)
    timeout_s: float
    #: cgroup share of this stage (the memory the code may use)
    memory_mb: int
    #: RLIMIT_AS in bytes, or None when the cgroup is the bound
    address_space_bytes: int | None
    #: RLIMIT_NPROC inside the jail, counting the zygote and the template
    nproc: int
    max_file_bytes: int
    nofile: int
    stdin: bool
    python_source: str | None = None
    oom_markers: tuple[str, ...] = field(default=())
    #: the wall-clock limit: timeout_s, or its backstop when time is judged on CPU time
    wall_limit_s: float = 0.0
    #: the limit on the CPU time of all the stage's processes (time_basis "cpu"), or None
    cpu_limit_s: float | None = None

    @property
    def wall_s(self) -> float:
        return self.wall_limit_s or self.timeout_s

    def to_wire(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "argv": list(self.argv),
            "python": self.python_source,
            "filename": PYTHON_SOURCE,
            "timeout": self.wall_s,
            "cpu_limit_ms": self.cpu_limit_s * 1000 if self.cpu_limit_s is not None else None,
            "as_bytes": self.address_space_bytes,
            "nproc": self.nproc,
            "fsize": self.max_file_bytes,
            "nofile": self.nofile,
            "stdin": self.stdin,
        }


def _fill(argv: Sequence[str], values: dict[str, int]) -> tuple[str, ...]:
    return tuple(arg.format(**values) if "{" in arg else arg for arg in argv)


def plan(lang: LanguageSpec, spec: RunSpec, config: NsjailConfig) -> list[StagePlan]:
    """The stages of one call, in order."""
    limits = spec.limits
    memory_mb = limits.memory_mb
    # the node's compile memory, lowered by the call's (the gateway caps it at the
    # tenant's maximum)
    compile_mb = min(config.compile_memory_mb, limits.compile_memory_mb)
    cpu_basis = limits.time_basis == "cpu"
    # the jail's own RLIMIT_FSIZE (the work tmpfs size) is the ceiling of any stage's
    fsize_cap = config.work_tmpfs_mb * MIB
    values = {
        "memory_mb": memory_mb,
        # leave the JVM / V8 head-room for code, metaspace and stacks under the cgroup
        "heap_mb": max(16, memory_mb * 3 // 4),
        "compile_heap_mb": max(16, compile_mb * 3 // 4),
    }
    stages: list[StagePlan] = []
    if lang.compile_argv is not None:
        stages.append(
            StagePlan(
                name="compile",
                argv=_fill(lang.compile_argv, values),
                timeout_s=limits.compile_timeout_s,
                wall_limit_s=limits.wall_limit(limits.compile_timeout_s),
                cpu_limit_s=limits.compile_timeout_s if cpu_basis else None,
                memory_mb=compile_mb,
                address_space_bytes=compile_mb * MIB if lang.compile_rlimit_as else None,
                nproc=min(config.compile_max_processes + JAIL_PROCESSES, config.max_pids_per_jail),
                max_file_bytes=min(max(limits.max_file_bytes, 64 * MIB), fsize_cap),
                nofile=max(config.nofile, 256),
                stdin=False,
                oom_markers=lang.oom_markers,
            )
        )
    stages.append(
        StagePlan(
            name="run",
            argv=_fill(lang.run_argv, values),
            timeout_s=limits.run_timeout_s,
            wall_limit_s=limits.wall_limit(limits.run_timeout_s),
            cpu_limit_s=limits.run_timeout_s if cpu_basis else None,
            memory_mb=memory_mb,
            address_space_bytes=memory_mb * MIB if lang.run_rlimit_as else None,
            nproc=min(
                limits.max_processes + lang.runtime_threads + JAIL_PROCESSES,
                config.max_pids_per_jail,
            ),
            max_file_bytes=min(limits.max_file_bytes, fsize_cap),
            nofile=config.nofile,
            stdin=True,
            python_source=spec.code if lang.inprocess_python else None,
            oom_markers=lang.oom_markers,
        )
    )
    return stages
