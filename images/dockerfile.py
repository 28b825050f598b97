"""``corral images build NAME -f Dockerfile``: the common Dockerfile instructions on top
of a local image, with no registry and no daemon.

Supported: ``FROM`` a local image (a name or digest; ``scratch``), ``RUN`` (shell and
exec form, chrooted in the tree in private mount and pid namespaces with /proc, /dev
and the host's resolv.conf, network on; ``chroot.py``), ``COPY [--chown=u:g]`` from the
build context (``context.py``), ``ENV``, ``ARG``, ``WORKDIR``, ``USER``, and ``CMD`` and
``ENTRYPOINT`` (recorded, not used by Corral). ``LABEL``, ``EXPOSE``, ``VOLUME``,
``STOPSIGNAL``, ``HEALTHCHECK`` and ``MAINTAINER`` are accepted and ignored (said in the
progress). Anything else (``ADD``, ``SHELL``, ``ONBUILD``, a second ``FROM``,
``COPY --from``, ``RUN --mount``, here-documents) is refused with the line number.

The parent's tree is copied (``cp -a --reflink=auto``) into the store's staging area and
built there; the parent is never touched, and a failing step leaves nothing visible.
"""

from __future__ import annotations

import logging
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from images import context as build_context
from images.chroot import run_in, userspec
from images.errors import ImageBuildError, ImageNotFound
from images.fsutil import copy_tree, resolve_in_root
from images.instructions import Instruction, expand, parse
from images.progress import Progress
from images.store import Image, ImageMeta, ImageStore, check_name

log = logging.getLogger(__name__)

IGNORED = frozenset({"LABEL", "EXPOSE", "VOLUME", "STOPSIGNAL", "HEALTHCHECK", "MAINTAINER"})
RUN_TIMEOUT_S = 3600.0


@dataclass
class _State:
    """The image config as the instructions change it."""

    env: dict[str, str] = field(default_factory=dict)
    args: dict[str, str] = field(default_factory=dict)
    user: str = "root"
    workdir: str = "/"
    cmd: tuple[str, ...] | None = None
    entrypoint: tuple[str, ...] | None = None

    def variables(self) -> dict[str, str]:
        return {**self.args, **self.env}


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
        instructions = parse(dockerfile.read_text())
    except OSError as exc:
        raise ImageBuildError(f"cannot read {dockerfile}: {exc}") from exc
    state = _State()
    while instructions and instructions[0].keyword == "ARG":
        _arg(state, instructions.pop(0))
    if not instructions or instructions[0].keyword != "FROM":
        raise ImageBuildError(f"{dockerfile}: the first instruction must be FROM")
    parent = _parent(store, instructions[0], state)
    if parent is not None:
        state.env = dict(parent.env)
        state.user, state.workdir = parent.user, parent.workdir
        state.cmd, state.entrypoint = parent.cmd, parent.entrypoint
    with store.staging() as rootfs:
        if parent is not None:
            progress.stage(f"FROM {parent.name or parent.digest} ({parent.short_digest})")
            rootfs.rmdir()
            copy_tree(parent.rootfs, rootfs)
        for instruction in instructions[1:]:
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


def _parent(store: ImageStore, instruction: Instruction, state: _State) -> Image | None:
    words = expand(instruction.args, state.args).split()
    if instruction.flags:
        raise instruction.error(f"--{instruction.flags[0][0]} is not supported")
    if len(words) == 3 and words[1].upper() == "AS":
        words = words[:1]  # a stage name; only one stage is supported
    if len(words) != 1:
        raise instruction.error("expected FROM IMAGE [AS NAME]")
    if words[0] == "scratch":
        return None
    try:
        return store.resolve(words[0])
    except ImageNotFound:
        raise instruction.error(
            f"no local image {words[0]!r}. No container registry is reachable from here: "
            "import the image first (corral images import), build it, or name a local "
            "image (corral images ls)"
        ) from None


def _apply(
    rootfs: Path, instruction: Instruction, state: _State, context: Path, progress: Progress
) -> None:
    keyword = instruction.keyword
    if keyword in IGNORED:
        progress.stage(f"  {keyword} ignored (not used by Corral)")
        return
    handlers = {
        "RUN": _run,
        "COPY": _copy,
        "ENV": _env,
        "ARG": _arg_step,
        "WORKDIR": _workdir,
        "USER": _user,
        "CMD": _cmd,
        "ENTRYPOINT": _cmd,
    }
    handler = handlers.get(keyword)
    if handler is None:
        why = {
            "FROM": "multi-stage builds are not supported (one FROM)",
            "ADD": "ADD is not supported: use COPY (and RUN tar for an archive)",
        }.get(keyword, "this instruction is not supported")
        raise instruction.error(why)
    handler(rootfs, instruction, state, context, progress)


def _no_flags(instruction: Instruction, allowed: tuple[str, ...] = ()) -> dict[str, str]:
    flags = dict(instruction.flags)
    for flag in flags:
        if flag not in allowed:
            raise instruction.error(f"--{flag} is not supported")
    return flags


def _command(instruction: Instruction) -> list[str]:
    exec_form = instruction.exec_form()
    if exec_form is not None:
        if not exec_form:
            raise instruction.error("an empty command")
        return exec_form
    return ["/bin/sh", "-c", instruction.args]


def _run(
    rootfs: Path, instruction: Instruction, state: _State, context: Path, progress: Progress
) -> None:
    _no_flags(instruction)
    run_in(
        rootfs,
        _command(instruction),
        what=f"Dockerfile line {instruction.line}: RUN",
        env=state.variables(),
        user=state.user,
        workdir=state.workdir,
        progress=progress,
        timeout_s=RUN_TIMEOUT_S,
    )


def _copy(
    rootfs: Path, instruction: Instruction, state: _State, context: Path, progress: Progress
) -> None:
    flags = _no_flags(instruction, allowed=("chown",))
    words = instruction.exec_form() or shlex.split(instruction.args)
    words = [expand(w, state.variables()) for w in words]
    if len(words) < 2:
        raise instruction.error("expected COPY SRC... DEST")
    owner = (0, 0)
    if "chown" in flags:
        spec, _ = userspec(rootfs, expand(flags["chown"], state.variables()))
        uid, _, gid = spec.partition(":")
        owner = (int(uid), int(gid))
    try:
        srcs = build_context.sources(context, words[:-1])
    except ImageBuildError as exc:
        raise instruction.error(str(exc)) from None
    build_context.copy_in(rootfs, srcs, words[-1], state.workdir, owner)


def _pairs(instruction: Instruction, variables: dict[str, str]) -> list[tuple[str, str]]:
    """``K=V K2="v 2"`` (or the old ``K V`` form) as pairs, values expanded."""
    text = instruction.args
    words = shlex.split(text, posix=True)
    if words and "=" not in words[0]:
        if len(words) < 2 and instruction.keyword == "ENV":
            raise instruction.error("expected NAME=VALUE")
        key, _, value = text.strip().partition(" ")
        return [(key, expand(value.strip(), variables))]
    pairs: list[tuple[str, str]] = []
    for word in words:
        key, sep, value = word.partition("=")
        if not key:
            raise instruction.error(f"invalid {word!r}")
        pairs.append((key, expand(value, variables) if sep else ""))
    return pairs


def _env(
    rootfs: Path, instruction: Instruction, state: _State, context: Path, progress: Progress
) -> None:
    _no_flags(instruction)
    for key, value in _pairs(instruction, state.variables()):
        state.env[key] = value


def _arg(state: _State, instruction: Instruction) -> None:
    _no_flags(instruction)
    for key, value in _pairs(instruction, state.variables()):
        state.args.setdefault(key, value)


def _arg_step(
    rootfs: Path, instruction: Instruction, state: _State, context: Path, progress: Progress
) -> None:
    _arg(state, instruction)


def _workdir(
    rootfs: Path, instruction: Instruction, state: _State, context: Path, progress: Progress
) -> None:
    _no_flags(instruction)
    path = expand(instruction.args.strip(), state.variables())
    if not path:
        raise instruction.error("expected a path")
    state.workdir = os.path.normpath(os.path.join(state.workdir, path))
    try:
        resolve_in_root(rootfs, state.workdir).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise instruction.error(f"cannot make {state.workdir}: {exc}") from exc


def _user(
    rootfs: Path, instruction: Instruction, state: _State, context: Path, progress: Progress
) -> None:
    _no_flags(instruction)
    user = expand(instruction.args.strip(), state.variables())
    if not user or " " in user:
        raise instruction.error("expected USER NAME[:GROUP]")
    if user not in ("root", "0", "0:0"):
        userspec(rootfs, user)  # it must exist in the image
    state.user = user


def _cmd(
    rootfs: Path, instruction: Instruction, state: _State, context: Path, progress: Progress
) -> None:
    _no_flags(instruction)
    command = tuple(_command(instruction))
    if instruction.keyword == "CMD":
        state.cmd = command
    else:
        state.entrypoint = command
