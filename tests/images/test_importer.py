"""Importing images: a plain rootfs tar, escaping members refused, a ``docker save``
tarball written by hand (layers, a whiteout, the config's Env/User/WorkingDir), and the
same image as an OCI archive (made from it with skopeo)."""

from __future__ import annotations

import hashlib
import io
import json
import stat
import subprocess
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from images import ImageBuildError, ImageStore
from images.importer import detect, import_file
from tests.requirements import require_tool

pytestmark = pytest.mark.usefixtures("require_root")

AddMembers = Callable[[tarfile.TarFile], None]


def entry(tar: tarfile.TarFile, name: str, kind: bytes = tarfile.REGTYPE, **kw: object) -> None:
    info = tarfile.TarInfo(name)
    info.type = kind
    data = kw.pop("data", b"")
    assert isinstance(data, bytes)
    for key, value in kw.items():
        setattr(info, key, value)
    if kind == tarfile.REGTYPE:
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    else:
        tar.addfile(info)


def write_tar(path: Path, add: AddMembers, mode: str = "w") -> Path:
    with tarfile.open(path, mode) as tar:  # type: ignore[call-overload]
        add(tar)
    return path


def rootfs_members(tar: tarfile.TarFile) -> None:
    entry(tar, "./", tarfile.DIRTYPE, mode=0o755)
    entry(tar, "./etc", tarfile.DIRTYPE, mode=0o755)
    entry(tar, "./etc/hostname", data=b"box\n", mode=0o644)
    entry(tar, "./usr/bin", tarfile.DIRTYPE, mode=0o755)
    entry(tar, "./usr/bin/su", data=b"\x7fELF", mode=0o4755)
    entry(tar, "./home/user", tarfile.DIRTYPE, mode=0o700, uid=1000, gid=1000)
    entry(tar, "./home/user/notes", data=b"mine", uid=1000, gid=1000, mode=0o600)
    entry(tar, "./bin", tarfile.SYMTYPE, linkname="usr/bin")
    entry(tar, "./etc/alternatives", tarfile.SYMTYPE, linkname="/usr/bin/su")
    entry(tar, "./usr/bin/su2", tarfile.LNKTYPE, linkname="./usr/bin/su")
    entry(tar, "./run/fifo", tarfile.FIFOTYPE, mode=0o600)


def test_plain_rootfs_tar_gz(store: ImageStore, tmp_path: Path) -> None:
    archive = write_tar(tmp_path / "rootfs.tar.gz", rootfs_members, "w:gz")
    assert detect(archive) == "rootfs"
    image = import_file(store, archive, name="plain")
    r = image.rootfs
    assert (r / "etc/hostname").read_text() == "box\n"
    assert stat.S_IMODE((r / "usr/bin/su").stat().st_mode) == 0o4755
    assert (r / "home/user/notes").stat().st_uid == 1000
    assert stat.S_IMODE((r / "home/user").stat().st_mode) == 0o700
    assert (r / "bin").readlink() == Path("usr/bin")
    assert (r / "etc/alternatives").readlink() == Path("/usr/bin/su")
    assert (r / "usr/bin/su2").stat().st_ino == (r / "usr/bin/su").stat().st_ino
    assert stat.S_ISFIFO((r / "run/fifo").lstat().st_mode)
    assert (image.source, image.user, image.workdir, image.env) == ("import", "root", "/", {})
    # The same archive again: the same digest, reused.
    assert import_file(store, archive, name="plain2").digest == image.digest


# Each writes a member that, unpacked naively, lands in OUTSIDE (a directory of the test).
EvilMembers = Callable[[tarfile.TarFile, str], None]


def _absolute(tar: tarfile.TarFile, outside: str) -> None:
    entry(tar, f"{outside}/evil", data=b"x")


def _dotdot(tar: tarfile.TarFile, outside: str) -> None:
    entry(tar, "etc/" + "../" * 30 + outside.lstrip("/") + "/evil", data=b"x")


def _through_symlink(tar: tarfile.TarFile, outside: str) -> None:
    entry(tar, "out", tarfile.SYMTYPE, linkname=outside)
    entry(tar, "out/evil", data=b"x")


def _over_symlink(tar: tarfile.TarFile, outside: str) -> None:
    entry(tar, "evil", tarfile.SYMTYPE, linkname=f"{outside}/evil")
    entry(tar, "evil", data=b"x")


def _hardlink_out(tar: tarfile.TarFile, outside: str) -> None:
    entry(tar, "evil", tarfile.LNKTYPE, linkname="../" * 30 + outside.lstrip("/") + "/secret")


def _hardlink_through_symlink(tar: tarfile.TarFile, outside: str) -> None:
    entry(tar, "out", tarfile.SYMTYPE, linkname=outside)
    entry(tar, "evil", tarfile.LNKTYPE, linkname="out/secret")


@pytest.mark.parametrize(
    "members",
    [_absolute, _dotdot, _through_symlink, _over_symlink, _hardlink_out, _hardlink_through_symlink],
)
def test_escaping_members_are_refused(
    store: ImageStore, tmp_path: Path, members: EvilMembers
) -> None:
    outside = tmp_path / "OUTSIDE"
    outside.mkdir()
    (outside / "secret").write_text("host file")
    archive = write_tar(tmp_path / "evil.tar", lambda tar: members(tar, str(outside)))
    with pytest.raises(ImageBuildError, match="refused"):
        import_file(store, archive, name="evil")
    assert store.list() == []
    assert list((store.root / ".staging").iterdir()) == []
    assert sorted(p.name for p in outside.iterdir()) == ["secret"]
    assert (outside / "secret").stat().st_nlink == 1


def test_not_a_tar_is_a_clear_error(store: ImageStore, tmp_path: Path) -> None:
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"not a tar at all" * 100)
    with pytest.raises(ImageBuildError, match="is not a tar archive"):
        import_file(store, junk, name="junk")


# --- docker save and OCI ------------------------------------------------------------------


def layer(add: AddMembers) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        add(tar)
    return buf.getvalue()


def docker_save(path: Path) -> Path:
    """A `docker save` tarball of two layers: the second deletes a file (whiteout)."""

    def base(tar: tarfile.TarFile) -> None:
        entry(tar, "etc", tarfile.DIRTYPE, mode=0o755)
        entry(tar, "etc/old", data=b"old\n")
        entry(tar, "etc/keep", data=b"keep\n")
        entry(tar, "srv", tarfile.DIRTYPE, mode=0o755)

    def top(tar: tarfile.TarFile) -> None:
        entry(tar, "etc", tarfile.DIRTYPE, mode=0o755)
        entry(tar, "etc/.wh.old", data=b"")
        entry(tar, "srv/app", tarfile.DIRTYPE, mode=0o755, uid=1000, gid=1000)
        entry(tar, "srv/app/main.py", data=b"print('hi')\n", uid=1000, gid=1000)

    layers = [layer(base), layer(top)]
    diff_ids = ["sha256:" + hashlib.sha256(data).hexdigest() for data in layers]
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {
                "Env": ["PATH=/usr/local/bin:/usr/bin:/bin", "GREETING=hello=world"],
                "WorkingDir": "/srv/app",
                "User": "1000:1000",
                "Cmd": ["python3", "main.py"],
            },
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
            "history": [{"created_by": "test"}, {"created_by": "test"}],
        }
    ).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    layer_names = [f"{d[7:]}/layer.tar" for d in diff_ids]
    manifest = json.dumps(
        [{"Config": config_name, "RepoTags": ["test/app:latest"], "Layers": layer_names}]
    ).encode()

    def archive(tar: tarfile.TarFile) -> None:
        entry(tar, config_name, data=config)
        for name, data in zip(layer_names, layers, strict=True):
            entry(tar, name.split("/")[0], tarfile.DIRTYPE, mode=0o755)
            entry(tar, name, data=data)
        entry(tar, "manifest.json", data=manifest)

    return write_tar(path, archive)


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    require_tool("skopeo", "scripts/setup-images.sh")
    require_tool("umoci", "scripts/setup-images.sh")
    return docker_save(tmp_path / "app.docker.tar")


def check_app_image(store: ImageStore, name: str) -> str:
    image = store.resolve(name)
    r = image.rootfs
    assert (r / "etc/keep").read_text() == "keep\n"
    assert not (r / "etc/old").exists(), "the whiteout of the second layer is applied"
    assert not (r / "etc/.wh.old").exists()
    assert (r / "srv/app/main.py").read_text() == "print('hi')\n"
    assert (r / "srv/app/main.py").stat().st_uid == 1000
    assert image.env == {"PATH": "/usr/local/bin:/usr/bin:/bin", "GREETING": "hello=world"}
    assert (image.user, image.workdir) == ("1000:1000", "/srv/app")
    assert image.cmd == ("python3", "main.py") and image.entrypoint is None
    return image.digest


def test_docker_save_tarball(store: ImageStore, saved: Path) -> None:
    assert detect(saved) == "docker-archive"
    import_file(store, saved, name="app")
    check_app_image(store, "app")
    assert list((store.root / ".staging").iterdir()) == []


def test_oci_archive_gives_the_same_image(store: ImageStore, saved: Path, tmp_path: Path) -> None:
    oci = tmp_path / "app.oci.tar"
    subprocess.run(
        [
            "skopeo",
            "--insecure-policy",
            "copy",
            "--quiet",
            f"docker-archive:{saved}",
            f"oci-archive:{oci}:latest",
        ],
        check=True,
    )
    assert detect(oci) == "oci-archive"
    import_file(store, oci, name="app-oci")
    import_file(store, saved, name="app-docker")
    assert check_app_image(store, "app-oci") == check_app_image(store, "app-docker")
