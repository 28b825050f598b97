"""The zygote's modules joined into the one script a jail runs: every module goes in, in
an order where each finds what it imports above it, the join refuses what would make the
script differ from the modules, and the jail's PID 1 runs exactly that script."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from node.fncall.nsjail import NsjailBackend, NsjailConfig, zygote
from node.fncall.nsjail.zygote.assembly import MODULES, AssemblyError, assemble

PACKAGE = Path(zygote.__file__).parent
HOST_ONLY = {"__init__", "assembly"}


def modules() -> list[tuple[str, str]]:
    return [(name, (PACKAGE / f"{name}.py").read_text()) for name in MODULES]


def test_every_module_of_the_package_is_joined_once() -> None:
    files = {path.stem for path in PACKAGE.glob("*.py")} - HOST_ONLY
    assert sorted(MODULES) == sorted(files)
    assert len(set(MODULES)) == len(MODULES)


def test_the_script_is_the_modules_joined_and_the_same_every_time() -> None:
    script = zygote.source()
    assert script == assemble(modules()) == assemble(modules())
    assert script.startswith("# The nsjail zygote")
    assert script.rstrip().endswith('if __name__ == "__main__":\n    main()')
    assert "node.fncall.nsjail" not in "".join(
        line for line in script.splitlines() if line.lstrip().startswith(("import ", "from "))
    )


def test_the_script_compiles_for_the_jails_python() -> None:
    """Debian 12's 3.11 runs it in the jail (the host's venv may be newer)."""
    python = str(NsjailConfig().python_path)
    done = subprocess.run(
        [python, "-I", "-c", "import sys; compile(sys.stdin.read(), '<zygote>', 'exec')"],
        input=zygote.source(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr


#: imports each module with none of its siblings loaded before, and says which failed
ALONE = """
import importlib, sys, traceback
failed = []
for name in sys.argv[1:]:
    for loaded in [m for m in sys.modules if m.startswith("node.fncall.nsjail.zygote.")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(f"node.fncall.nsjail.zygote.{name}")
    except Exception:
        failed.append(f"{name}: {traceback.format_exc()}")
print("\\n".join(failed))
"""


def test_each_module_imports_on_its_own() -> None:
    """For its unit tests and mypy: each module, imported with none of its siblings loaded
    (one fresh interpreter for all: importing the backend's package is the slow part)."""
    done = subprocess.run(
        [sys.executable, "-c", ALONE, *MODULES],
        capture_output=True,
        text=True,
        check=False,
        cwd=PACKAGE.parents[3],
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""


P = "node.fncall.nsjail.zygote"
FUTURE = "from __future__ import annotations\n"


@pytest.mark.parametrize(
    ("parts", "error"),
    [
        ([("a", "X = 1\n"), ("b", "X = 2\n")], "'X' is already defined by a"),
        ([("a", "def f() -> None: ...\n"), ("b", "class f: ...\n")], "already defined"),
        ([("a", f"from {P}.b import Y\n"), ("b", "Y = 1\n")], "not defined by an earlier"),
        ([("a", "Y = 1\n"), ("b", f"from {P}.c import Y\n")], "'Y' is a's"),
        ([("a", "import httpx\n")], "httpx is not of the standard library"),
        ([("a", "def f() -> None:\n    import httpx\n")], "httpx is not of the standard"),
        ([("a", "from . import b\n")], "relative import"),
        ([("a", "import os as o\n")], "import os as o"),
        ([("a", "from os import path as p\n")], "as p"),
        ([("a", "import stat\n"), ("b", "stat = 1\n")], "defined and imported"),
    ],
)
def test_the_join_refuses_what_would_change_the_code(
    parts: list[tuple[str, str]], error: str
) -> None:
    with pytest.raises(AssemblyError, match=error):
        assemble([(name, FUTURE + text) for name, text in parts])


def test_siblings_imports_are_dropped_and_the_standard_librarys_gathered() -> None:
    script = assemble(
        [
            ("a", FUTURE + "import os\nfrom typing import Any\n\nX: Any = os.sep\n"),
            (
                "b",
                FUTURE + f"import os\nfrom typing import NoReturn\nfrom {P}.a import X\n\nY = X\n",
            ),
        ]
    )
    body = script.split("\n\n\n", 1)[1]
    assert script.count("import os\n") == 1
    assert "from typing import Any, NoReturn\n" in script
    assert f"{P}" not in script
    assert body.index("X: Any = os.sep") < body.index("Y = X")
    namespace: dict[str, Any] = {}
    exec(compile(script, "<joined>", "exec"), namespace)
    assert namespace["Y"] == namespace["os"].sep


@pytest.mark.nsjail
@pytest.mark.asyncio(loop_scope="module")
async def test_a_jails_pid_1_runs_the_joined_script(
    python_only: Callable[..., Coroutine[Any, Any, NsjailBackend]],
) -> None:
    rt = await python_only()
    [jail, *_] = rt.pool.workers()  # type: ignore[union-attr]
    assert jail.zygote_pid is not None
    cmdline = Path(f"/proc/{jail.zygote_pid}/cmdline")
    argv = (await asyncio.to_thread(cmdline.read_bytes)).split(b"\0")
    assert argv[argv.index(b"-c") + 1].decode() == zygote.source()
