"""Running a command inside an image tree being built (RUN, apt-get, useradd).

The command runs under ``unshare --mount --pid --fork --kill-child`` with private mount
propagation: /proc, a small /dev (null, zero, full, random, urandom, tty, a private
devpts) and the host's /etc/resolv.conf are mounted inside the tree in that namespace
only, so every mount ends with the command, however it ends (no unmount to forget, none
leaked by a crash). The network is the host's, so apt can reach the mirror. The mounts
are made by a shell with a minimal environment of the host's; then ``python -I`` (still
on the host) does the chroot, the cd to the workdir, drops to the user (uid, gid, no
other groups) and execs the command with the environment it should have (PATH, HOME,
TERM and the image's env), so that environment reaches only the image's own programs.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from images.errors import ImageBuildError
from images.fsutil import resolve_in_root
from images.progress import Progress
from images.tools import require, run_tool

log = logging.getLogger(__name__)

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
HOST_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
_DEVICES = ("null", "zero", "full", "random", "urandom", "tty")

# Runs as pid 1 of the new namespaces, on the host, with nothing of the image's
# environment: $1 is the tree, $2 "1" to bind resolv.conf, then the entering command.
_SETUP = r"""
set -eu
R=$1; RESOLV=$2; shift 2
mount -t proc -o nosuid,nodev,noexec proc "$R/proc"
mount -t tmpfs -o nosuid,mode=0755,size=64k dev "$R/dev"
for d in null zero full random urandom tty; do
    : > "$R/dev/$d"; mount --bind "/dev/$d" "$R/dev/$d"
done
mkdir "$R/dev/pts" "$R/dev/shm"
mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts "$R/dev/pts"
ln -s pts/ptmx "$R/dev/ptmx"; ln -s /proc/self/fd "$R/dev/fd"
ln -s /proc/self/fd/0 "$R/dev/stdin"; ln -s /proc/self/fd/1 "$R/dev/stdout"
ln -s /proc/self/fd/2 "$R/dev/stderr"
mount -t tmpfs -o nosuid,nodev,mode=1777 shm "$R/dev/shm"
if [ "$RESOLV" = 1 ]; then
    mount --bind /etc/resolv.conf "$R/etc/resolv.conf"
    mount -o remount,bind,ro "$R/etc/resolv.conf"
fi
exec "$@"
"""

# Then (python -I, still on the host): chroot, cd, drop to the user, and exec the command
# with the image's environment, which so reaches only the image's own programs.
# argv: tree, "uid:gid" or "", workdir, the environment as JSON, the command.
_ENTER = """
import json, os, sys
root, spec, workdir, env = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
command = sys.argv[5:]
os.chroot(root)
os.chdir(workdir)
if spec:
    uid, gid = (int(x) for x in spec.split(":"))
    os.setgroups([gid])
    os.setgid(gid)
    os.setuid(uid)
try:
    os.execvpe(command[0], command, env)
except OSError as exc:
    sys.stderr.write(f"cannot run {command[0]}: {exc}\\n")
    sys.exit(127)
"""


@contextlib.contextmanager
def _mount_targets(rootfs: Path) -> Iterator[bool]:
    """Make sure /proc, /dev and /etc/resolv.conf exist to mount on; yields whether
    resolv.conf can be bound. What is created here for the run is removed after it."""
    created: list[Path] = []
    for name in ("proc", "dev"):
        target = rootfs / name
        if not target.is_dir() or target.is_symlink():
            raise ImageBuildError(f"{target} is not a directory: not a usable root filesystem")
    resolv = rootfs / "etc" / "resolv.conf"
    bindable = Path("/etc/resolv.conf").is_file() and (rootfs / "etc").is_dir()
    if bindable and resolv.is_symlink():
        bindable = False  # a bind would follow it out of the tree
    elif bindable and not resolv.exists():
        resolv.touch(mode=0o644)
        created.append(resolv)
    try:
        yield bindable
    finally:
        for path in created:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


def userspec(rootfs: Path, user: str) -> tuple[str, str]:
    """``("uid:gid", home)`` of ``user`` ("name", "uid", "name:group" or "uid:gid") as
    the image's own /etc/passwd and /etc/group say."""
    name, _, group = user.partition(":")
    uid = gid = None
    home = "/"
    if name.isdigit():
        uid = int(name)
    for line in _read_lines(rootfs / "etc" / "passwd"):
        parts = line.split(":")
        if len(parts) >= 6 and (parts[0] == name or (uid is not None and parts[2] == name)):
            uid, gid, home = int(parts[2]), int(parts[3]), parts[5] or "/"
            break
    if uid is None:
        raise ImageBuildError(f"user {name!r} does not exist in the image")
    if group:
        gid = int(group) if group.isdigit() else None
        for line in _read_lines(rootfs / "etc" / "group"):
            parts = line.split(":")
            if len(parts) >= 3 and parts[0] == group:
                gid = int(parts[2])
        if gid is None:
            raise ImageBuildError(f"group {group!r} does not exist in the image")
    return f"{uid}:{gid if gid is not None else uid}", home


def _read_lines(path: Path) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return []


def run_in(
    rootfs: Path,
    command: Sequence[str],
    *,
    what: str,
    env: Mapping[str, str] | None = None,
    user: str = "root",
    workdir: str = "/",
    progress: Progress | None = None,
    timeout_s: float | None = None,
) -> str:
    """Run ``command`` chrooted in ``rootfs`` (as ``user``, in ``workdir``); returns its
    output, or raises ``ImageBuildError`` with the output's tail."""
    unshare = require("unshare", "util-linux")
    spec, home = ("", "/root") if user in ("root", "0", "0:0") else userspec(rootfs, user)
    environment = {"PATH": DEFAULT_PATH, "HOME": home, "TERM": "dumb"}
    environment.update(env or {})
    if workdir != "/":
        try:
            resolve_in_root(rootfs, workdir).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ImageBuildError(f"{what}: cannot make the workdir {workdir}: {exc}") from exc
    with _mount_targets(rootfs) as resolv:
        argv = [
            unshare,
            "--mount",
            "--pid",
            "--fork",
            "--kill-child",
            "--propagation",
            "private",
            "/bin/sh",
            "-c",
            _SETUP,
            "setup",
            os.fspath(rootfs),
            "1" if resolv else "0",
            sys.executable,
            "-I",
            "-c",
            _ENTER,
            os.fspath(rootfs),
            spec,
            workdir,
            json.dumps(environment),
            *command,
        ]
        host_env = {"PATH": HOST_PATH, "LC_ALL": "C"}
        return run_tool(argv, what=what, progress=progress, env=host_env, timeout_s=timeout_s)
