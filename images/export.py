"""An image as the control plane sends it to a node (``wire.images``): its manifest and
its root filesystem as a tar stream.

The tar is GNU tar's (``tar --numeric-owner --sort=name -C rootfs -cf - .``): the
tree's root as ``./`` with its own owner and mode, numeric owners (never names looked up
on this host), permission bits (setuid, setgid, sticky), symlinks as they are, hard links
as links, fifos and device nodes. That is what the digest covers (``digest.py``), so the
same tree unpacked by ``safetar`` gives the same digest. Sockets are left out by tar (a
tree with one cannot be sent: its digest would not match); extended attributes and
timestamps are not part of the digest and are not checked.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import tempfile
from collections.abc import AsyncIterator

from images.store import Image
from images.tools import require
from wire.images import ImageManifest

log = logging.getLogger(__name__)

_CHUNK = 1 << 20


def manifest(image: Image) -> ImageManifest:
    fields = dataclasses.asdict(image)
    return ImageManifest.model_validate({k: fields[k] for k in ImageManifest.model_fields})


async def tar_stream(image: Image) -> AsyncIterator[bytes]:
    """The image's root filesystem as an uncompressed tar, in chunks. tar is killed if
    the consumer stops early (a client that went away); a tar that fails is logged, and
    the receiver's digest check refuses what it got."""
    tar = require("tar", "tar")
    with tempfile.TemporaryFile() as stderr:
        proc = await asyncio.create_subprocess_exec(
            tar,
            "--numeric-owner",
            "--sort=name",
            "-C",
            str(image.rootfs),
            "-cf",
            "-",
            ".",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr,
        )
        try:
            assert proc.stdout is not None
            while chunk := await proc.stdout.read(_CHUNK):
                yield chunk
            code = await proc.wait()
            if code != 0:
                stderr.seek(0)
                message = stderr.read()[-500:].decode(errors="replace").strip()
                log.error("image %s: tar failed (exit %d): %s", image.digest, code, message)
        finally:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
