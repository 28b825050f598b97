"""Building an image from Debian's packages.

``debootstrap --variant=minbase SUITE DIR MIRROR`` (MIRROR: the one this machine's apt
uses, ``mirror.py``), then, chrooted in the tree (``chroot.py``): ``apt-get install
--no-install-recommends`` of the recipe's packages (debootstrap's ``--include`` does not
resolve dependencies well enough for e.g. python3-ipykernel), the sandbox user ``user``
(uid/gid 1000, home /home/user, /bin/bash; root stays), /etc/hostname and /etc/hosts,
and an /etc/profile whose login shells ask bash for their uid (``_quick_login_profile``).
Documentation, man pages, apt's lists and caches and logs are left out or removed.

debootstrap itself runs in a private mount namespace, so the /proc and /sys it mounts in
the tree end with it even if it is killed.
"""

from __future__ import annotations

import glob
import logging
import os
from pathlib import Path

from images.chroot import run_in
from images.errors import ImageBuildError
from images.fsutil import remove_tree
from images.mirror import debian_mirror
from images.progress import Progress
from images.recipes import SANDBOX_HOME, SANDBOX_UID, SANDBOX_USER, Recipe
from images.store import Image, ImageMeta, ImageStore, check_name
from images.tools import require, run_tool

log = logging.getLogger(__name__)

HOSTNAME = "sandbox"
DEBOOTSTRAP_TIMEOUT_S = 1800.0
APT_TIMEOUT_S = 1800.0

# Keep docs out of every later apt-get install too (copyright files stay).
_DPKG_EXCLUDES = """\
path-exclude=/usr/share/doc/*
path-include=/usr/share/doc/*/copyright
path-exclude=/usr/share/man/*
path-exclude=/usr/share/info/*
path-exclude=/usr/share/locale/*
path-include=/usr/share/locale/locale.alias
path-exclude=/usr/share/lintian/*
"""
_APT_NO_RECOMMENDS = 'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n'
_APT_ENV = {"DEBIAN_FRONTEND": "noninteractive", "LC_ALL": "C"}

# Removed at the end, relative to the tree (globs).
_CLEAN = (
    "var/cache/apt/*.bin",
    "var/cache/apt/archives/*.deb",
    "var/cache/apt/archives/partial/*",
    "var/lib/apt/lists/*",
    "var/cache/debconf/*-old",
    "var/lib/dpkg/*-old",
    "var/log/*.log",
    "var/log/apt/*",
    "debootstrap",
    "etc/resolv.conf",
    "root/.cache",
    "tmp/*",
)


def build(
    store: ImageStore,
    recipe: Recipe,
    *,
    name: str | None = None,
    progress: Progress | None = None,
    mirror: str | None = None,
) -> Image:
    """Build ``recipe`` into ``store`` as ``name`` (default: the recipe's name)."""
    check_name(name or recipe.name)
    progress = progress or Progress()
    debootstrap = require("debootstrap", "debootstrap")
    unshare = require("unshare", "util-linux")
    if os.geteuid() != 0:
        raise ImageBuildError("building an image with debootstrap needs root")
    mirror = mirror or debian_mirror(recipe.suite)
    with store.staging() as rootfs:
        progress.stage(f"debootstrap --variant=minbase {recipe.suite} from {mirror}")
        run_tool(
            [
                unshare,
                "--mount",
                "--fork",
                "--kill-child",
                "--propagation",
                "private",
                debootstrap,
                "--variant=minbase",
                recipe.suite,
                os.fspath(rootfs),
                mirror,
            ],
            what="debootstrap",
            progress=progress,
            timeout_s=DEBOOTSTRAP_TIMEOUT_S,
        )
        _configure_apt(rootfs)
        if recipe.packages:
            progress.stage(
                f"installing {len(recipe.packages)} packages: {' '.join(recipe.packages)}"
            )
            run_in(
                rootfs,
                ["apt-get", "update", "-q"],
                what="apt-get update",
                env=_APT_ENV,
                progress=progress,
                timeout_s=APT_TIMEOUT_S,
            )
            run_in(
                rootfs,
                ["apt-get", "install", "-y", "-q", "--no-install-recommends", *recipe.packages],
                what="apt-get install",
                env=_APT_ENV,
                progress=progress,
                timeout_s=APT_TIMEOUT_S,
            )
        _open_pip(rootfs)
        progress.stage(f"creating the sandbox user {SANDBOX_USER!r} (uid {SANDBOX_UID})")
        _add_user(rootfs)
        _set_hostname(rootfs)
        _quick_login_profile(rootfs)
        progress.stage("cleaning apt caches, docs and logs")
        run_in(rootfs, ["apt-get", "clean"], what="apt-get clean", env=_APT_ENV)
        _clean(rootfs)
        progress.stage("hashing the tree")
        image = store.add(
            rootfs,
            ImageMeta(
                name=name or recipe.name,
                source="debootstrap",
                packages=recipe.packages,
                env=dict(recipe.env),
                user=recipe.user,
                workdir=recipe.workdir,
            ),
        )
    progress.stage(
        f"image {image.name} {image.digest} ({image.size_bytes / 1e6:.0f} MB) "
        f"built in {progress.elapsed:.0f} s"
    )
    return image


def _open_pip(rootfs: Path) -> None:
    """``pip install`` works in the image, as in E2B's: no PEP 668 marker (an agent's
    sandbox is its own machine; Debian's packages stay where apt put them, pip's go to
    /usr/local)."""
    for marker in glob.glob(
        os.path.join(glob.escape(os.fspath(rootfs)), "usr/lib/python3*/EXTERNALLY-MANAGED")
    ):
        os.unlink(marker)


def _configure_apt(rootfs: Path) -> None:
    (rootfs / "etc/dpkg/dpkg.cfg.d/01-corral-nodoc").write_text(_DPKG_EXCLUDES)
    (rootfs / "etc/apt/apt.conf.d/01-corral-norecommends").write_text(_APT_NO_RECOMMENDS)


def _add_user(rootfs: Path) -> None:
    uid = str(SANDBOX_UID)
    run_in(rootfs, ["groupadd", "--gid", uid, SANDBOX_USER], what="groupadd")
    run_in(
        rootfs,
        [
            "useradd",
            "--uid",
            uid,
            "--gid",
            uid,
            "--create-home",
            "--home-dir",
            SANDBOX_HOME,
            "--shell",
            "/bin/bash",
            SANDBOX_USER,
        ],
        what="useradd",
    )


def _set_hostname(rootfs: Path) -> None:
    (rootfs / "etc/hostname").write_text(HOSTNAME + "\n")
    (rootfs / "etc/hosts").write_text(
        f"127.0.0.1\tlocalhost\n127.0.1.1\t{HOSTNAME}\n::1\tlocalhost ip6-localhost ip6-loopback\n"
    )


def _quick_login_profile(rootfs: Path) -> None:
    """Let a login shell take its effective uid from bash instead of a subshell.

    Debian's /etc/profile runs ``$(id -u)`` to choose PATH: a fork and an exec of ``id``
    in every login shell. The E2B SDKs run every command as ``/bin/bash -l -c CMD``, so
    that was 1.8 ms of each ``commands.run("true")`` (docs/benchmarks-history.md, "Exec
    through the E2B SDK: a login shell that forks"). ``${EUID:-...}``
    gives bash's own value; a shell without ``EUID`` (dash as ``sh -l``) still asks ``id``.
    """
    profile = rootfs / "etc/profile"
    if profile.is_file():
        profile.write_text(quick_uid(profile.read_text()))


def quick_uid(profile: str) -> str:
    """``profile`` with each ``$(id -u)`` that chooses PATH or PS1 taking ``$EUID`` first."""
    return profile.replace('"$(id -u)"', '"${EUID:-$(id -u)}"')


def _clean(rootfs: Path) -> None:
    for pattern in _CLEAN:
        for match in glob.glob(os.path.join(glob.escape(os.fspath(rootfs)), pattern)):
            remove_tree(Path(match))
    for docs in ("usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale"):
        _prune(rootfs / docs, keep=("copyright", "locale.alias"))


def _prune(directory: Path, *, keep: tuple[str, ...]) -> None:
    """Delete files under ``directory`` except those named in ``keep``; then the
    directories left empty."""
    if not directory.is_dir():
        return
    for dirpath, dirnames, filenames in os.walk(directory, topdown=False):
        for filename in filenames:
            if filename not in keep:
                os.unlink(os.path.join(dirpath, filename))
        for dirname in dirnames:
            path = os.path.join(dirpath, dirname)
            if os.path.islink(path):
                os.unlink(path)
            elif not os.listdir(path):
                os.rmdir(path)
