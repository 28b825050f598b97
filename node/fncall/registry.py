"""Backends register here under their own name; a duplicate name is an error."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from node.fncall.base import FnBackend

if TYPE_CHECKING:
    from node.settings import NodeSettings

FnBackendFactory = Callable[["NodeSettings"], FnBackend]

_FACTORIES: dict[str, FnBackendFactory] = {}


class DuplicateRuntimeError(ValueError):
    pass


class UnknownRuntimeError(KeyError):
    pass


def register(name: str, factory: FnBackendFactory) -> None:
    if name in _FACTORIES:
        raise DuplicateRuntimeError(f"runtime {name!r} is already registered")
    _FACTORIES[name] = factory


def names() -> list[str]:
    _load_builtins()
    return sorted(_FACTORIES)


def create(name: str, settings: NodeSettings) -> FnBackend:
    _load_builtins()
    try:
        factory = _FACTORIES[name]
    except KeyError:
        raise UnknownRuntimeError(
            f"unknown runtime {name!r}; known: {sorted(_FACTORIES)}"
        ) from None
    return factory(settings)


_loaded = False


def _load_builtins() -> None:
    """Import the built-in backends once, so each registers itself."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    import importlib

    for module in ("node.fncall.fake", "node.fncall.nsjail", "node.fncall.wasm"):
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
