"""Reading a Dockerfile: its instructions, in order, with their line numbers.

Handles comments, blank lines, ``\\`` continuations (comment lines inside them too),
the exec form (a JSON array) and the shell form, and ``--flag=value`` options before an
instruction's arguments. Variable references (``$VAR``, ``${VAR}``,
``${VAR:-default}``) are expanded by ``expand`` when an instruction is built. Parser
directives (``# syntax=``) and here-documents are not supported.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from images.errors import ImageBuildError

_FLAG = re.compile(r"--([a-z][a-z-]*)=(\S*)")
_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case: FROM, RUN, ...
    args: str  # the rest of the line, flags removed, continuations joined
    line: int
    flags: tuple[tuple[str, str], ...] = ()

    def exec_form(self) -> list[str] | None:
        """The arguments as a JSON array of strings, if written so."""
        text = self.args.strip()
        if not text.startswith("["):
            return None
        try:
            value = json.loads(text)
        except ValueError:
            return None
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return value
        return None

    def error(self, message: str) -> ImageBuildError:
        return ImageBuildError(f"Dockerfile line {self.line}: {self.keyword}: {message}")


def parse(text: str) -> list[Instruction]:
    """The instructions of a Dockerfile's ``text``."""
    found: list[Instruction] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        start = i
        raw = lines[i].strip()
        i += 1
        if not raw or raw.startswith("#"):
            continue
        while raw.endswith("\\"):
            raw = raw[:-1]
            while i < len(lines) and (not lines[i].strip() or lines[i].lstrip().startswith("#")):
                i += 1
            if i >= len(lines):
                break
            raw += " " + lines[i].strip()
            i += 1
        keyword, _, rest = raw.partition(" ")
        rest = rest.strip()
        flags: list[tuple[str, str]] = []
        while (match := _FLAG.match(rest)) is not None:
            flags.append((match.group(1), match.group(2)))
            rest = rest[match.end() :].lstrip()
        if "<<" in rest and keyword.upper() in ("RUN", "COPY"):
            heredoc = re.search(r"<<-?\s*['\"]?[A-Za-z_]+['\"]?\s*$", rest)
            if heredoc is not None:
                raise ImageBuildError(
                    f"Dockerfile line {start + 1}: here-documents are not supported"
                )
        found.append(Instruction(keyword.upper(), rest, start + 1, tuple(flags)))
    return found


def expand(text: str, env: Mapping[str, str]) -> str:
    """``text`` with ``$VAR``, ``${VAR}`` and ``${VAR:-default}`` replaced from ``env``
    (an unknown variable becomes its default, or empty)."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(3)
        default = match.group(2) or ""
        return env.get(name) or default

    return _VAR.sub(value, text)
