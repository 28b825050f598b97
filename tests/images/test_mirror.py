"""The Debian mirror is read from the machine's apt sources, in both formats."""

from __future__ import annotations

from pathlib import Path

import pytest

from images import ImageBuildError
from images.mirror import apt_sources, debian_mirror

DEB822 = """\
Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main
"""

ONE_LINE = """\
# deb http://commented.example/debian bookworm main
deb [arch=amd64 signed-by=/k.gpg] http://sec.example/debian-security bookworm-security main
deb http://one.example/debian bookworm main contrib
"""


def test_deb822_sources(tmp_path: Path) -> None:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d/debian.sources").write_text(DEB822)
    assert debian_mirror("bookworm", tmp_path) == "http://mirror.example/debian"
    assert [s.uri for s in apt_sources(tmp_path)] == [
        "http://mirror.example/debian",
        "http://mirror.example/debian-security",
    ]


def test_one_line_sources_with_options(tmp_path: Path) -> None:
    (tmp_path / "sources.list").write_text(ONE_LINE)
    assert debian_mirror("bookworm", tmp_path) == "http://one.example/debian"
    assert debian_mirror("trixie", tmp_path) == "http://one.example/debian"  # not security


def test_disabled_stanzas_are_ignored(tmp_path: Path) -> None:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d/a.sources").write_text(
        "Types: deb\nURIs: http://off.example/debian\nSuites: bookworm\nEnabled: no\n"
    )
    with pytest.raises(ImageBuildError, match="no Debian mirror"):
        debian_mirror("bookworm", tmp_path)


def test_this_machine_has_a_mirror() -> None:
    assert debian_mirror("bookworm").startswith(("http://", "https://"))
