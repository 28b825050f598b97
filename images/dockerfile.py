"""``corral images build NAME -f Dockerfile``: the common Dockerfile instructions on top
of a local image, with no registry and no daemon.

The instruction subset, its refusals and the image config are ``images.steps``' (shared
with a tenant's build through the API, ``app.images.build``). Here: ``FROM`` a local
image (a name or digest; ``scratch``), ``RUN`` chrooted in the tree in private mount and
pid namespaces with /proc, /dev and the host's resolv.conf, network on (``chroot.py``),
``COPY [--chown=u:g]`` from the build context (``context.py``), ``WORKDIR`` made in the
tree and ``USER`` checked against the image's accounts.

The parent's tree is copied (``cp -a --reflink=auto``) into the store's staging area and
built there; the parent is never touched, and a failing step leaves nothing visible.
"""

from __future__ import annotations

import logging
from pathlib import Path

from images import context as build_context
from images import steps
from images.chroot import run_in, userspec
from images.errors import ImageBuildError, ImageNotFound
from images.fsutil import copy_tree, resolve_in_root
from images.instructions import Instruction
from images.progress import Progress
from images.steps import BuildState
from images.store import Image, ImageMeta, ImageStore, check_name

log = logging.getLogger(__name__)

RUN_TIMEOUT_S = 3600.0


def build(
    store: ImageStore,
    name: str,
    dockerfile: Path,
    *,
    context: Path,
    progress: Progress | None = None,
) -> Image:
    """Build ``dockerfile`` (COPY sources from ``context``) into ``store`` as ``name``."""
    check_name(name)
    progress = progress or Progress()
    try:
        text = dockerfile.read_text()
    except OSError as exc:
        raise ImageBuildError(f"cannot read {dockerfile}: {exc}") from exc
    plan = steps.plan(text, source=str(dockerfile))
    state = plan.state()
    parent = _parent(store, plan)
    if parent is not None:
        state.inherit(
            env=parent.env,
            user=parent.user,
            workdir=parent.workdir,
            cmd=parent.cmd,
            entrypoint=parent.entrypoint,
        )
    with store.staging() as rootfs:
        if parent is not None:
            progress.stage(f"FROM {parent.name or parent.digest} ({parent.short_digest})")
            rootfs.rmdir()
            copy_tree(parent.rootfs, rootfs)
        for instruction in plan.steps:
            progress.stage(
                f"line {instruction.line}: {instruction.keyword} {instruction.args[:120]}"
            )
            _apply(rootfs, instruction, state, context, progress)
        progress.stage("hashing the tree")
        image = store.add(
            rootfs,
            ImageMeta(
                name=name,
                source="dockerfile",
                packages=parent.packages if parent is not None else (),
                env=state.env,
                user=state.user,
                workdir=state.workdir,
                parent=parent.digest if parent is not None else None,
                cmd=state.cmd,
                entrypoint=state.entrypoint,
            ),
        )
    progress.stage(f"image {image.name} {image.digest} ({image.size_bytes / 1e6:.1f} MB)")
    return image


def _parent(store: ImageStore, plan: steps.Plan) -> Image | None:
    if plan.base is None:
        return None
    try:
        return store.resolve(plan.base)
    except ImageNotFound:
        raise plan.origin.error(
            f"no local image {plan.base!r}. No container registry is reachable from here: "
            "import the image first (corral images import), build it, or name a local "
            "image (corral images ls)"
        ) from None


def _apply(
    rootfs: Path, instruction: Instruction, state: BuildState, context: Path, progress: Progress
) -> None:
    keyword = instruction.keyword
    if keyword in steps.IGNORED:
        progress.stage(f"  {keyword} ignored (not used by Corral)")
    elif keyword == "RUN":
        run_in(
            rootfs,
            steps.command(instruction),
            what=f"Dockerfile line {instruction.line}: RUN",
            env=state.variables(),
            user=state.user,
            workdir=state.workdir,
            progress=progress,
            timeout_s=RUN_TIMEOUT_S,
        )
    elif keyword == "COPY":
        _copy(rootfs, instruction, state, context)
    elif steps.configure(instruction, state):
        if keyword == "WORKDIR":
            try:
                resolve_in_root(rootfs, state.workdir).mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise instruction.error(f"cannot make {state.workdir}: {exc}") from exc
        elif keyword == "USER" and not steps.is_root(state.user):
            userspec(rootfs, state.user)  # it must exist in the image
    else:  # steps.plan refused it already
        raise instruction.error("this instruction is not supported")


def _copy(rootfs: Path, instruction: Instruction, state: BuildState, context: Path) -> None:
    copy = steps.copy_of(instruction, state)
    owner = (0, 0)
    if copy.chown is not None:
        spec, _ = userspec(rootfs, copy.chown)
        uid, _, gid = spec.partition(":")
        owner = (int(uid), int(gid))
    try:
        srcs = build_context.sources(context, copy.sources)
    except ImageBuildError as exc:
        raise instruction.error(str(exc)) from None
    build_context.copy_in(rootfs, srcs, copy.dest, state.workdir, owner)
