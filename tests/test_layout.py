"""The planes import one way: the data plane (``runtimes``) and the contracts (``wire``)
never import the control plane (``app``), and ``wire`` imports neither plane. Checked on
the source, every import statement, at any depth (TYPE_CHECKING blocks included)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def imported_modules(package: str) -> dict[str, set[str]]:
    """Top-level packages imported by each file of ``package``."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        names: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
        found[str(path.relative_to(ROOT))] = names
    return found


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [("runtimes", {"app", "migrations"}), ("wire", {"app", "runtimes", "migrations"})],
)
def test_planes_import_one_way(package: str, forbidden: set[str]) -> None:
    offenders = {
        path: sorted(names & forbidden)
        for path, names in imported_modules(package).items()
        if names & forbidden
    }
    assert offenders == {}


def test_the_check_sees_imports_at_any_depth() -> None:
    """Not vacuous: it finds the control plane's own imports of both."""
    app = set().union(*imported_modules("app").values())
    assert {"wire", "runtimes"} <= app


def test_the_sdk_needs_only_httpx_and_the_standard_library() -> None:
    """``corral`` is installed beside a trainer: nothing of the server comes with it."""
    import sys

    allowed = set(sys.stdlib_module_names) | {"httpx", "corral", "__future__"}
    offenders = {
        path: sorted(names - allowed)
        for path, names in imported_modules("corral").items()
        if names - allowed
    }
    assert offenders == {}
    assert "httpx" in set().union(*imported_modules("corral").values())


def test_the_sdk_exports_what_it_documents() -> None:
    import corral

    assert sorted(corral.__all__) == corral.__all__
    assert all(hasattr(corral, name) for name in corral.__all__)
    assert {"Corral", "AsyncCorral", "Sandbox", "CorralError", "NotFound"} <= set(corral.__all__)
