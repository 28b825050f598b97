"""The Debian mirror this machine's apt uses, read at run time (never a hard-coded host).

Looked for in ``/etc/apt/sources.list.d/*.sources`` (deb822) and then
``/etc/apt/sources.list`` and ``sources.list.d/*.list`` (one-line form): the first
``deb`` source whose suites include the wanted suite (e.g. "bookworm"), else the first
``deb`` source that is not a security archive.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from images.errors import ImageBuildError

log = logging.getLogger(__name__)

APT_DIR = Path("/etc/apt")


@dataclass(frozen=True)
class AptSource:
    uri: str
    suites: tuple[str, ...]
    components: tuple[str, ...]


def _deb822(text: str) -> list[AptSource]:
    found: list[AptSource] = []
    for stanza in text.split("\n\n"):
        fields: dict[str, str] = {}
        key = ""
        for raw in stanza.splitlines():
            if raw.startswith("#") or not raw.strip():
                continue
            if raw[0] in " \t" and key:
                fields[key] += " " + raw.strip()
                continue
            key, _, value = raw.partition(":")
            key = key.strip().lower()
            fields[key] = value.strip()
        if "deb" not in fields.get("types", "").split():
            continue
        if fields.get("enabled", "yes").lower() == "no":
            continue
        suites = tuple(fields.get("suites", "").split())
        components = tuple(fields.get("components", "").split())
        found.extend(AptSource(uri, suites, components) for uri in fields.get("uris", "").split())
    return found


def _one_line(text: str) -> list[AptSource]:
    found: list[AptSource] = []
    for raw in text.splitlines():
        words = raw.split("#", 1)[0].split()
        if not words or words[0] != "deb":
            continue
        words = words[1:]
        if words and words[0].startswith("["):  # [arch=amd64 signed-by=...]
            while words and not words[0].endswith("]"):
                words = words[1:]
            words = words[1:]
        if len(words) >= 2:
            found.append(AptSource(words[0], (words[1],), tuple(words[2:])))
    return found


def apt_sources(apt_dir: Path = APT_DIR) -> list[AptSource]:
    """Every ``deb`` source of the machine, in apt's reading order."""
    found: list[AptSource] = []
    lists = apt_dir / "sources.list.d"
    for path in sorted(lists.glob("*.sources")) if lists.is_dir() else []:
        found.extend(_deb822(path.read_text()))
    main = apt_dir / "sources.list"
    for path in ([main] if main.is_file() else []) + sorted(lists.glob("*.list")):
        found.extend(_one_line(path.read_text()))
    return found


def debian_mirror(suite: str, apt_dir: Path = APT_DIR) -> str:
    """The URI of the machine's Debian mirror for ``suite``."""
    sources = [s for s in apt_sources(apt_dir) if s.uri.startswith(("http://", "https://"))]
    for source in sources:
        if suite in source.suites:
            return source.uri
    for source in sources:
        if not any(s.endswith("-security") or s.endswith("/updates") for s in source.suites):
            return source.uri
    raise ImageBuildError(
        f"no Debian mirror in {apt_dir}/sources.list or sources.list.d: debootstrap needs "
        "the URI of the mirror apt uses"
    )
