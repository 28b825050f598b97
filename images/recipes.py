"""What an image built from Debian's packages contains: a ``Recipe`` per image name.

``RECIPES`` holds the built-in ones; ``corral images build NAME`` without ``-f`` builds
the recipe called NAME.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from images.chroot import DEFAULT_PATH

SANDBOX_USER = "user"  # E2B's SDK runs commands as "user" by default
SANDBOX_UID = 1000
SANDBOX_HOME = "/home/user"


@dataclass(frozen=True)
class Recipe:
    name: str
    packages: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    user: str = SANDBOX_USER
    workdir: str = SANDBOX_HOME
    suite: str = "bookworm"


PYTHON = Recipe(
    name="python",
    packages=(
        "python3",
        "python3-pip",
        "python3-venv",
        "git",
        "bash",
        "coreutils",
        "ca-certificates",
        "build-essential",
        # Debian's ipykernel: the E2B code interpreter runs a Jupyter kernel per context.
        "python3-ipykernel",
        "procps",
        "curl",
        "findutils",
    ),
    env={"PATH": DEFAULT_PATH, "LANG": "C.UTF-8", "PYTHONUNBUFFERED": "1"},
)

RECIPES: dict[str, Recipe] = {PYTHON.name: PYTHON}
