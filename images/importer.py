"""Importing an image from a file: ``corral images import FILE --name NAME``.

Three formats, told apart by the archive's members:

* a ``docker save`` tarball (``manifest.json``) and an OCI image archive
  (``oci-layout``, ``index.json``): Debian's skopeo copies it into an OCI layout
  (``skopeo copy docker-archive:FILE oci:DIR:corral``, or ``oci-archive:``) and umoci
  unpacks the layers (``umoci unpack --image DIR:corral BUNDLE``, whiteouts applied);
  the image config's Env, User, WorkingDir, Cmd and Entrypoint are kept;
* anything else is a plain root filesystem tar (.tar, .tar.gz, ...), unpacked by
  ``safetar`` (members that could escape the tree are refused).

Everything is unpacked inside the store's staging area, so a failure or a crash leaves
nothing visible and the leftovers are removed.
"""

from __future__ import annotations

import json
import logging
import os
import tarfile
from pathlib import Path
from typing import Any, Literal

from images import safetar
from images.errors import ImageBuildError
from images.fsutil import remove_tree
from images.progress import Progress
from images.store import Image, ImageMeta, ImageStore, check_name
from images.tools import require, run_tool

log = logging.getLogger(__name__)

Format = Literal["docker-archive", "oci-archive", "rootfs"]
TAG = "corral"
TOOL_TIMEOUT_S = 1800.0


def detect(path: Path) -> Format:
    """Which kind of archive ``path`` is."""
    try:
        with tarfile.open(path, mode="r:*") as tar:
            names = {m.name.removeprefix("./") for m in tar.getmembers()}
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise ImageBuildError(f"{path} is not a tar archive: {exc}") from exc
    if "manifest.json" in names:
        return "docker-archive"
    if "oci-layout" in names and "index.json" in names:
        return "oci-archive"
    return "rootfs"


def import_file(
    store: ImageStore, path: Path, *, name: str, progress: Progress | None = None
) -> Image:
    """Add the image in ``path`` to ``store`` as ``name``."""
    check_name(name)
    progress = progress or Progress()
    fmt = detect(path)
    progress.stage(f"importing {path} ({fmt})")
    with store.staging() as rootfs:
        if fmt == "rootfs":
            count = safetar.unpack(path, rootfs)
            progress.stage(f"unpacked {count} members")
            meta = ImageMeta(name=name, source="import")
        else:
            config = _unpack_image(path, fmt, rootfs, progress)
            meta = _meta(name, config)
        progress.stage("hashing the tree")
        image = store.add(rootfs, meta)
    progress.stage(f"image {image.name} {image.digest} ({image.size_bytes / 1e6:.1f} MB)")
    return image


def _unpack_image(path: Path, fmt: Format, rootfs: Path, progress: Progress) -> dict[str, Any]:
    """Unpack a docker/OCI archive's layers into ``rootfs`` (empty, in a staging box);
    returns the image config's ``config`` object."""
    skopeo = require("skopeo", "skopeo")
    umoci = require("umoci", "umoci")
    if os.geteuid() != 0:
        raise ImageBuildError("importing a docker or OCI archive needs root (umoci unpack)")
    box = rootfs.parent
    layout, bundle = box / "oci", box / "bundle"
    try:
        # A local file into a local directory: no registry, no signature to check.
        run_tool(
            [
                skopeo,
                "--insecure-policy",
                "copy",
                "--quiet",
                f"{fmt}:{path.resolve()}",
                f"oci:{layout}:{TAG}",
            ],
            what="skopeo copy",
            progress=progress,
            timeout_s=TOOL_TIMEOUT_S,
        )
        config = _image_config(layout)
        progress.stage("unpacking the layers (umoci)")
        run_tool(
            [umoci, "unpack", "--image", f"{layout}:{TAG}", os.fspath(bundle)],
            what="umoci unpack",
            progress=progress,
            timeout_s=TOOL_TIMEOUT_S,
        )
        rootfs.rmdir()
        os.rename(bundle / "rootfs", rootfs)
    finally:
        remove_tree(layout)
        remove_tree(bundle)
    return config


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ImageBuildError(f"unreadable {path.name} in the image: {exc}") from exc


def _blob(layout: Path, digest: str) -> Any:
    algorithm, _, hex_ = digest.partition(":")
    if algorithm != "sha256" or not hex_.isalnum():
        raise ImageBuildError(f"unsupported blob digest {digest!r}")
    return _read_json(layout / "blobs" / algorithm / hex_)


def _image_config(layout: Path) -> dict[str, Any]:
    """The ``config`` object of the image tagged ``TAG`` in the OCI layout."""
    index = _read_json(layout / "index.json")
    manifests = index.get("manifests") or []
    tagged = [
        m
        for m in manifests
        if (m.get("annotations") or {}).get("org.opencontainers.image.ref.name") == TAG
    ]
    if not (tagged or manifests):
        raise ImageBuildError("the archive holds no image manifest")
    manifest = _blob(layout, (tagged or manifests)[0]["digest"])
    config = _blob(layout, manifest["config"]["digest"])
    inner = config.get("config") or {}
    return inner if isinstance(inner, dict) else {}


def _meta(name: str, config: dict[str, Any]) -> ImageMeta:
    env: dict[str, str] = {}
    for item in config.get("Env") or []:
        key, sep, value = str(item).partition("=")
        if sep:
            env[key] = value
    cmd, entrypoint = config.get("Cmd"), config.get("Entrypoint")
    return ImageMeta(
        name=name,
        source="import",
        env=env,
        user=str(config.get("User") or "root"),
        workdir=str(config.get("WorkingDir") or "/"),
        cmd=tuple(cmd) if cmd else None,
        entrypoint=tuple(entrypoint) if entrypoint else None,
    )
