"""The one script a jail runs, joined from the zygote's modules (docs/nsjail.md, "The
zygote's source").

A jail's interpreter receives its program as one ``-c`` argument, so the modules of this
package are joined, at the host's first start of a jail (then cached), into one text: a
header of their standard-library imports, then each module's body in the order of
``MODULES`` (each imports only from modules before it), with its imports of its siblings
dropped: once joined, the names they import are the ones defined above. The join checks
what makes that sound and raises ``AssemblyError`` otherwise: only the standard library
and siblings are imported, siblings only at the top of a module and from an earlier one,
and no name is defined twice. The result depends only on the files' text: the same tree
gives the same script, byte for byte.
"""

from __future__ import annotations

import ast
import functools
import re
import sys
from importlib import resources

PACKAGE = "node.fncall.nsjail.zygote"
#: the jail's modules, in the order they are joined (see the package's docstring)
MODULES = (
    "common",
    "framing",
    "startup",
    "staging",
    "fetch",
    "pythonrun",
    "child",
    "siblingfork",
    "template",
    "handles",
    "capture",
    "accounting",
    "cleanup",
    "stage",
    "main",
)
HEADER = (
    "# The nsjail zygote, joined from node/fncall/nsjail/zygote/ by its assembly module\n"
    "# (one text: a jail's interpreter runs it with -c). Edit the modules, not this.\n"
)


class AssemblyError(Exception):
    """The modules cannot be joined into one script soundly."""


@functools.cache
def source() -> str:
    """The script a jail runs (joined once per process)."""
    package = resources.files(PACKAGE)
    return assemble(
        [(name, package.joinpath(f"{name}.py").read_text(encoding="utf-8")) for name in MODULES]
    )


def assemble(modules: list[tuple[str, str]]) -> str:
    """Join ``(name, text)`` modules, in the order given, into one script."""
    plain: set[str] = set()  # ``import x``
    names_from: dict[str, set[str]] = {}  # ``from x import a, b``
    owner: dict[str, str] = {}  # each top-level name and the module defining it
    bodies: list[str] = []
    for name, text in modules:
        tree = ast.parse(text, filename=f"{name}.py")
        _check_nested_imports(name, tree)
        lines = text.splitlines(keepends=True)
        dropped: set[int] = set()
        for node in tree.body:
            if isinstance(node, ast.Import | ast.ImportFrom):
                dropped.update(range(node.lineno - 1, node.end_lineno or node.lineno))
                _gather(name, node, owner, plain, names_from)
                continue
            for defined in _defines(node):
                if defined in owner:
                    raise AssemblyError(
                        f"{name}: {defined!r} is already defined by {owner[defined]}"
                    )
                owner[defined] = name
        body = "".join(line for i, line in enumerate(lines) if i not in dropped).strip("\n")
        body = re.sub(r"\n{4,}", "\n\n\n", body)  # where the imports were
        bodies.append(f"# --- {name}.py\n{body}\n")
    clashes = (plain | {n for names in names_from.values() for n in names}) & owner.keys()
    if clashes:
        raise AssemblyError(f"defined and imported from the standard library: {sorted(clashes)}")
    imports = ["from __future__ import annotations"]
    imports += [f"import {module}" for module in sorted(plain)]
    imports += [
        f"from {module} import {', '.join(sorted(names))}"
        for module, names in sorted(names_from.items())
    ]
    return HEADER + "\n".join(imports) + "\n\n\n" + "\n\n".join(bodies)


def _gather(
    name: str,
    node: ast.Import | ast.ImportFrom,
    owner: dict[str, str],
    plain: set[str],
    names_from: dict[str, set[str]],
) -> None:
    """Note a top-level import: a sibling's names must be defined above; anything else
    must be the standard library's, without an alias."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            _stdlib(name, alias.name)
            if alias.asname is not None:
                raise AssemblyError(f"{name}: import {alias.name} as {alias.asname}")
            plain.add(alias.name)
        return
    module = node.module or ""
    if node.level:
        raise AssemblyError(f"{name}: a relative import (name the sibling in full)")
    if module == "__future__":
        return
    for alias in node.names:
        if alias.asname is not None:
            raise AssemblyError(f"{name}: from {module} import {alias.name} as {alias.asname}")
    if module.startswith(f"{PACKAGE}."):
        for alias in node.names:
            if alias.name not in owner:
                raise AssemblyError(
                    f"{name}: {alias.name!r} from {module} is not defined by an earlier module"
                )
            if owner[alias.name] != module.rpartition(".")[2]:
                raise AssemblyError(f"{name}: {alias.name!r} is {owner[alias.name]}'s")
        return
    _stdlib(name, module)
    names_from.setdefault(module, set()).update(alias.name for alias in node.names)


def _check_nested_imports(name: str, tree: ast.Module) -> None:
    """Imports inside functions (lazy ones) stay in the body: standard library only."""
    top = {id(node) for node in tree.body}
    for node in ast.walk(tree):
        if id(node) in top:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                _stdlib(name, alias.name)
        elif isinstance(node, ast.ImportFrom):
            _stdlib(name, "." * node.level + (node.module or ""))


def _stdlib(name: str, module: str) -> None:
    if module.split(".")[0] not in sys.stdlib_module_names:
        raise AssemblyError(f"{name}: {module} is not of the standard library (or not here)")


def _defines(node: ast.stmt) -> list[str]:
    """The names a top-level statement binds."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return [node.name]
    targets = node.targets if isinstance(node, ast.Assign) else []
    if isinstance(node, ast.AnnAssign):
        targets = [node.target]
    return [n.id for target in targets for n in ast.walk(target) if isinstance(n, ast.Name)]
