"""Steps of a Debian-built image that need no debootstrap run."""

from __future__ import annotations

from pathlib import Path

from images.debootstrap import _open_pip
from images.recipes import DATA, PYTHON, RECIPES


def test_pip_is_not_walled_off_in_an_image_for_agents(tmp_path: Path) -> None:
    """Debian's PEP 668 marker made `pip install` fail with externally-managed-environment
    in a sandbox (newcomer review 3, step 33)."""
    stdlib = tmp_path / "usr" / "lib" / "python3.11"
    stdlib.mkdir(parents=True)
    (stdlib / "EXTERNALLY-MANAGED").write_text("[externally-managed]\n")
    (stdlib / "os.py").write_text("")
    _open_pip(tmp_path)
    assert sorted(p.name for p in stdlib.iterdir()) == ["os.py"]


def test_the_data_image_is_the_python_image_and_the_data_stack() -> None:
    assert RECIPES["data"] is DATA and set(PYTHON.packages) < set(DATA.packages)
    for package in ("python3-numpy", "python3-pandas", "python3-matplotlib", "python3-pil"):
        assert package in DATA.packages
