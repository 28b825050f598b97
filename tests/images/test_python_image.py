"""The default ``python`` image that scripts/setup-images.sh builds (once per machine):
python3, pip, venv, git, gcc, ipykernel, the sandbox ``user`` account and a login
profile that forks nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from images import Image, ImageNotFound, ImageStore
from images.debootstrap import quick_uid
from node.settings import NodeSettings
from tests.requirements import missing

ROOT = Path(__file__).resolve().parents[2]
CHROOT = shutil.which("chroot") or "/usr/sbin/chroot"


@pytest.fixture(scope="module")
def python_image() -> Image:
    if os.geteuid() != 0:
        missing("chroot into the python image needs root")
    images_dir = NodeSettings().resolved_images_dir
    if not images_dir.is_absolute():
        images_dir = ROOT / images_dir
    try:
        return ImageStore(images_dir).resolve("python")
    except ImageNotFound:
        missing(f"no python image in {images_dir} (scripts/setup-images.sh builds it)")


def chroot(image: Image, script: str, user: str = "1000:1000") -> str:
    # A plain chroot, no mounts and no writes: the image's rootfs stays as it is.
    done = subprocess.run(
        [
            "chroot",
            f"--userspec={user}",
            "--groups=" + user.split(":")[1],
            str(image.rootfs),
            *("/bin/bash", "-c", script),
        ],
        capture_output=True,
        text=True,
        env={**image.env, "HOME": "/home/user"},
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_python_image_has_the_tools(python_image: Image) -> None:
    out = chroot(
        python_image,
        "python3 --version; python3 -m pip --version; python3 -m venv --help >/dev/null"
        " && echo venv-ok; git --version; gcc --version | head -1; g++ --version | head -1;"
        " make --version | head -1; curl --version | head -1; test -x /usr/bin/ps && echo ps-ok;"
        " python3 -c 'import ipykernel, sys; print(\"ipykernel\", ipykernel.__version__)'",
    )
    for expected in ("Python 3.11", "pip ", "venv-ok", "git version", "gcc", "g++", "GNU Make"):
        assert expected in out, out
    assert "curl " in out and "ps-ok" in out and "ipykernel" in out


def test_python_image_runs_as_user_with_a_home(python_image: Image) -> None:
    out = chroot(python_image, "id; echo $HOME; test -w /home/user && echo home-writable")
    assert "uid=1000(user) gid=1000(user)" in out
    assert "home-writable" in out
    passwd = (python_image.rootfs / "etc/passwd").read_text()
    assert "user:x:1000:1000::/home/user:/bin/bash" in passwd
    assert passwd.startswith("root:x:0:0:")
    assert (python_image.user, python_image.workdir) == ("user", "/home/user")


def test_python_image_is_lean_and_recorded(python_image: Image) -> None:
    rootfs = python_image.rootfs
    assert (rootfs / "etc/hostname").read_text() == "sandbox\n"
    assert not list((rootfs / "var/lib/apt/lists").glob("*_Packages"))
    assert not list((rootfs / "var/cache/apt/archives").glob("*.deb"))
    assert not (rootfs / "usr/share/man/man1").exists()
    assert not (rootfs / "etc/resolv.conf").exists(), "the host's DNS setup is not kept"
    assert python_image.source == "debootstrap"
    assert "python3-ipykernel" in python_image.packages
    assert python_image.env["PATH"].startswith("/usr/local/sbin")
    assert 100e6 < python_image.size_bytes < 1e9


def test_a_login_shell_takes_its_uid_from_bash() -> None:
    """Debian's /etc/profile asks ``id -u`` in a subshell; the image's asks bash first."""
    debian = 'if [ "$(id -u)" -eq 0 ]; then\n  PATH="/sbin"\nfi\n'
    assert quick_uid(debian) == 'if [ "${EUID:-$(id -u)}" -eq 0 ]; then\n  PATH="/sbin"\nfi\n'
    assert quick_uid("PATH=/bin\n") == "PATH=/bin\n"


def test_python_image_login_shells_run_no_id(python_image: Image) -> None:
    """With no ``id`` to be found, a login bash still chooses the right PATH for the user
    and for root (a ``$(id -u)`` would fail: 'integer expression expected')."""
    profile = (python_image.rootfs / "etc/profile").read_text()
    assert "${EUID:-$(id -u)}" in profile
    login = ("/bin/bash", "-l", "-c", 'echo "$PATH"')  # no PATH of the host's to find id
    for user, expected in (("1000:1000", "/usr/games"), ("0:0", "/usr/sbin")):
        done = subprocess.run(
            [CHROOT, f"--userspec={user}", str(python_image.rootfs), *login],
            capture_output=True,
            text=True,
            env={"PATH": "/nonexistent", "HOME": "/home/user"},
            timeout=60,
            check=False,
        )
        assert done.returncode == 0 and done.stderr == "", done.stderr
        assert expected in done.stdout, done.stdout
