"""A Dockerfile read as a build plan, for both builders: the operator's
(``images.dockerfile``: a tree on the host) and a tenant's (``app.images.build``: inside a
sandbox of the tenant's). One instruction subset, one set of refusals, one image config
as the instructions change it; each builder only says how a step touches its files.

Supported: ``FROM`` (one; ``AS NAME`` accepted), ``RUN`` (shell and exec form),
``COPY [--chown=u:g]``, ``ENV``, ``ARG``, ``WORKDIR``, ``USER``, and ``CMD`` and
``ENTRYPOINT`` (recorded). ``LABEL``, ``EXPOSE``, ``VOLUME``, ``STOPSIGNAL``,
``HEALTHCHECK`` and ``MAINTAINER`` are accepted and ignored. Anything else (``ADD``,
``SHELL``, ``ONBUILD``, a second ``FROM``, ``COPY --from``, ``RUN --mount``,
here-documents) is refused with its line number, when the plan is read: before anything
is built.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field

from images.errors import ImageBuildError
from images.instructions import Instruction, expand, parse

#: accepted and ignored (said in the progress): nothing in Corral uses them
IGNORED = frozenset({"LABEL", "EXPOSE", "VOLUME", "STOPSIGNAL", "HEALTHCHECK", "MAINTAINER"})
#: the flags each instruction accepts (any other is refused)
_FLAGS: dict[str, tuple[str, ...]] = {
    "RUN": (),
    "COPY": ("chown",),
    "ENV": (),
    "ARG": (),
    "WORKDIR": (),
    "USER": (),
    "CMD": (),
    "ENTRYPOINT": (),
}
_REFUSED = {
    "FROM": "multi-stage builds are not supported (one FROM)",
    "ADD": "ADD is not supported: use COPY (and RUN tar for an archive)",
}


@dataclass
class BuildState:
    """The image config as the instructions change it."""

    env: dict[str, str] = field(default_factory=dict)
    args: dict[str, str] = field(default_factory=dict)
    user: str = "root"
    workdir: str = "/"
    cmd: tuple[str, ...] | None = None
    entrypoint: tuple[str, ...] | None = None

    def variables(self) -> dict[str, str]:
        return {**self.args, **self.env}

    def inherit(
        self,
        *,
        env: Mapping[str, str],
        user: str,
        workdir: str,
        cmd: tuple[str, ...] | None = None,
        entrypoint: tuple[str, ...] | None = None,
    ) -> None:
        """Start from the parent image's config (its ARGs stay this build's)."""
        self.env = dict(env)
        self.user, self.workdir = user, workdir
        self.cmd, self.entrypoint = cmd, entrypoint


@dataclass(frozen=True)
class Plan:
    """A Dockerfile checked: its ``FROM`` (``base``: the image named, None for
    ``scratch``), the steps after it, and the ARGs given before it."""

    origin: Instruction
    base: str | None
    steps: tuple[Instruction, ...]
    args: dict[str, str]

    def state(self) -> BuildState:
        return BuildState(args=dict(self.args))


def plan(text: str, *, source: str = "the Dockerfile") -> Plan:
    """The plan of a Dockerfile's ``text``; ``ImageBuildError`` (with the line) for an
    instruction or flag outside the supported subset."""
    instructions = parse(text)
    state = BuildState()
    while instructions and instructions[0].keyword == "ARG":
        arg(state, instructions.pop(0))
    if not instructions or instructions[0].keyword != "FROM":
        raise ImageBuildError(f"{source}: the first instruction must be FROM")
    origin = instructions[0]
    for step in instructions[1:]:
        check(step)
    return Plan(origin, base_of(origin, state.args), tuple(instructions[1:]), state.args)


def base_of(instruction: Instruction, args: Mapping[str, str]) -> str | None:
    """The image a ``FROM`` names (None: ``scratch``)."""
    if instruction.flags:
        raise instruction.error(f"--{instruction.flags[0][0]} is not supported")
    words = expand(instruction.args, args).split()
    if len(words) == 3 and words[1].upper() == "AS":
        words = words[:1]  # a stage name; only one stage is supported
    if len(words) != 1:
        raise instruction.error("expected FROM IMAGE [AS NAME]")
    return None if words[0] == "scratch" else words[0]


def check(instruction: Instruction) -> None:
    """Refuse an instruction, or a flag of one, that is not supported."""
    if instruction.keyword in IGNORED:
        return
    allowed = _FLAGS.get(instruction.keyword)
    if allowed is None:
        why = _REFUSED.get(instruction.keyword, "this instruction is not supported")
        raise instruction.error(why)
    for flag, _ in instruction.flags:
        if flag not in allowed:
            raise instruction.error(f"--{flag} is not supported")
    if instruction.keyword == "COPY":
        words = instruction.exec_form() or shlex.split(instruction.args)
        _inside(instruction, words[:-1])


def command(instruction: Instruction) -> list[str]:
    """A RUN's (CMD's, ENTRYPOINT's) argv: its exec form, or ``/bin/sh -c`` its text."""
    exec_form = instruction.exec_form()
    if exec_form is not None:
        if not exec_form:
            raise instruction.error("an empty command")
        return exec_form
    return ["/bin/sh", "-c", instruction.args]


@dataclass(frozen=True)
class Copy:
    """A COPY's sources (patterns in the context), destination and ``--chown``."""

    sources: list[str]
    dest: str
    chown: str | None

    def target(self, workdir: str) -> str:
        """The destination as an absolute path in the image."""
        return self.dest if self.dest.startswith("/") else os.path.join(workdir, self.dest)

    def into_dir(self, *, any_dir: bool) -> bool:
        """Whether the destination is a directory the sources go into: it ends in "/",
        there are several sources, or one is a directory (whose contents are copied)."""
        return self.dest.endswith("/") or len(self.sources) > 1 or any_dir


def copy_of(instruction: Instruction, state: BuildState) -> Copy:
    words = instruction.exec_form() or shlex.split(instruction.args)
    words = [expand(w, state.variables()) for w in words]
    if len(words) < 2:
        raise instruction.error("expected COPY SRC... DEST")
    _inside(instruction, words[:-1])
    chown = dict(instruction.flags).get("chown")
    return Copy(words[:-1], words[-1], expand(chown, state.variables()) if chown else None)


def _inside(instruction: Instruction, patterns: list[str]) -> None:
    for pattern in patterns:
        if pattern.startswith("/") or ".." in pattern.split("/"):
            raise instruction.error(f"COPY source {pattern!r} is outside the build context")


def configure(instruction: Instruction, state: BuildState) -> bool:
    """Apply an instruction that only changes the config (ENV, ARG, CMD, ENTRYPOINT,
    and WORKDIR and USER, which a builder then makes or checks in its tree); False for
    one that is not of these (RUN, COPY, ignored ones)."""
    keyword = instruction.keyword
    if keyword == "ENV":
        for key, value in _pairs(instruction, state.variables()):
            state.env[key] = value
    elif keyword == "ARG":
        arg(state, instruction)
    elif keyword in ("CMD", "ENTRYPOINT"):
        argv = tuple(command(instruction))
        if keyword == "CMD":
            state.cmd = argv
        else:
            state.entrypoint = argv
    elif keyword == "WORKDIR":
        path = expand(instruction.args.strip(), state.variables())
        if not path:
            raise instruction.error("expected a path")
        state.workdir = os.path.normpath(os.path.join(state.workdir, path))
    elif keyword == "USER":
        user = expand(instruction.args.strip(), state.variables())
        if not user or " " in user:
            raise instruction.error("expected USER NAME[:GROUP]")
        state.user = user
    else:
        return False
    return True


def arg(state: BuildState, instruction: Instruction) -> None:
    for key, value in _pairs(instruction, state.variables()):
        state.args.setdefault(key, value)


def is_root(user: str) -> bool:
    return user in ("root", "0", "0:0")


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
