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

#: what E2B's code-interpreter template carries for a data-science agent, from Debian's
#: packages: the code interpreter's charts (matplotlib), smolagents' CodeAgent (Pillow)
DATA_PACKAGES = (
    "python3-numpy",
    "python3-pandas",
    "python3-matplotlib",
    "python3-pil",
    "python3-scipy",
    "python3-sklearn",
    "python3-seaborn",
    "python3-requests",
    "python3-bs4",
    "python3-lxml",
    "python3-openpyxl",
    "python3-sympy",
    "python3-yaml",
    "fonts-dejavu-core",
)

DATA = Recipe(name="data", packages=(*PYTHON.packages, *DATA_PACKAGES), env=PYTHON.env)

RECIPES: dict[str, Recipe] = {PYTHON.name: PYTHON, DATA.name: DATA}
