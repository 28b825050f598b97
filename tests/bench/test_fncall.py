"""``bench/fncall.py --compare REV`` runs the server of an earlier commit: that server must
import the earlier commit's code, not this tree's (``python -m`` puts the working
directory first on ``sys.path``, before ``PYTHONPATH``)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from fncall import Server  # noqa: E402


def test_the_server_of_another_tree_imports_that_tree(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "app").mkdir(parents=True)
    (tree / "app" / "__init__.py").write_text("")
    marker = tmp_path / "imported-from"
    (tree / "app" / "__main__.py").write_text(
        f"import app\nopen({str(marker)!r}, 'w').write(app.__file__)\n"
    )
    server = Server(1, "fake", root=tree)
    try:
        assert server.proc.wait(timeout=60) == 0
    finally:
        server.stop()
    assert Path(marker.read_text()).resolve().is_relative_to(tree.resolve())
