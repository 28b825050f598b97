"""The planes import one way. The node (``node``) and the images (``images``) never import
the gateway (``app``); the shared helpers (``common``) import neither plane; the contracts
(``wire``) import nothing of either plane nor the helpers; and the node's backends (FnCall
backends in ``node.fncall``, sandboxes, pools) never import the agent (``node.agent``) that
drives them. Checked on the source, every import statement, at any depth (TYPE_CHECKING
blocks included)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def imported_names(package: str) -> dict[str, set[str]]:
    """Modules imported by each file of ``package`` (a folder), by their full names."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        names: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module)
                names.update(f"{node.module}.{alias.name}" for alias in node.names)
        found[str(path.relative_to(ROOT))] = names
    return found


def imported_modules(package: str) -> dict[str, set[str]]:
    """Top-level packages imported by each file of ``package``."""
    return {
        path: {name.split(".")[0] for name in names}
        for path, names in imported_names(package).items()
    }


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        ("node", {"app", "migrations"}),
        ("images", {"app", "node", "migrations"}),
        ("common", {"app", "node", "images", "migrations"}),
        ("wire", {"app", "node", "images", "common", "migrations"}),
    ],
)
def test_planes_import_one_way(package: str, forbidden: set[str]) -> None:
    offenders = {
        path: sorted(names & forbidden)
        for path, names in imported_modules(package).items()
        if names & forbidden
    }
    assert offenders == {}


@pytest.mark.parametrize("backends", ["node/fncall", "node/sandboxes", "node/pools"])
def test_backends_never_import_the_agent(backends: str) -> None:
    offenders = {
        path: sorted(n for n in names if n == "node.agent" or n.startswith("node.agent."))
        for path, names in imported_names(backends).items()
    }
    assert {path: names for path, names in offenders.items() if names} == {}


def test_the_check_sees_imports_at_any_depth() -> None:
    """Not vacuous: it finds the gateway's own imports of each, and the agent's of the
    backends."""
    app = set().union(*imported_modules("app").values())
    assert {"wire", "node", "images", "common"} <= app
    agent = set().union(*imported_names("node/agent").values())
    assert any(name.startswith("node.fncall") for name in agent)
    assert any(name.startswith("node.sandboxes") for name in agent)


def test_the_sdk_needs_only_httpx_and_the_standard_library() -> None:
    """``corral`` is installed beside a trainer: nothing of the server comes with it."""
    import sys

    allowed = set(sys.stdlib_module_names) | {"httpx", "corral", "__future__"}
    # The one optional extra (corral[terminal]), imported when a terminal opens.
    extras = {"corral/_terminal.py": {"websockets"}}
    offenders = {
        path: sorted(names - allowed - extras.get(path, set()))
        for path, names in imported_modules("corral").items()
        if names - allowed - extras.get(path, set())
    }
    assert offenders == {}
    assert "httpx" in set().union(*imported_modules("corral").values())


def test_the_sdk_imports_without_its_optional_extra() -> None:
    """``import corral`` (and a sandbox's terminal object) works where websockets is absent;
    only opening the terminal asks for it."""
    import subprocess
    import sys

    script = (
        "import sys; sys.modules['websockets'] = None\n"
        "import corral\n"
        "assert 'websockets' not in [m.split('.')[0] for m in sys.modules if sys.modules[m]]\n"
        "import asyncio\n"
        "t = corral.AsyncTerminal('ws://127.0.0.1:9/x', {})\n"
        "try:\n"
        "    asyncio.run(t.__aenter__())\n"
        "except RuntimeError as e:\n"
        "    assert 'corral[terminal]' in str(e), e\n"
        "else:\n"
        "    raise SystemExit('opened without websockets')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


def test_the_sdk_exports_what_it_documents() -> None:
    import corral

    assert sorted(corral.__all__) == corral.__all__
    assert all(hasattr(corral, name) for name in corral.__all__)
    assert {"Corral", "AsyncCorral", "Sandbox", "CorralError", "NotFound"} <= set(corral.__all__)
