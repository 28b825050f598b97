"""The gateway's reading of a node's error answers."""

from __future__ import annotations

import importlib
import pkgutil

import node.sandboxes
from app.sandboxes.nodes import _ERRORS
from node.sandboxes.base import SandboxError


def _subclasses(kind: type[SandboxError]) -> set[type[SandboxError]]:
    found = set(kind.__subclasses__())
    for sub in list(found):
        found |= _subclasses(sub)
    return found


def test_every_client_error_a_node_answers_reaches_the_client_as_one() -> None:
    """A code the gateway does not know becomes 503 ``node_unavailable``: right for a
    node's failure, wrong for a refusal the client must see (a 4xx)."""
    for module in pkgutil.walk_packages(node.sandboxes.__path__, "node.sandboxes."):
        importlib.import_module(module.name)
    refusals = {kind.code: kind for kind in _subclasses(SandboxError) if kind.status < 500}
    assert "pause_failed" in refusals  # the walk found the backends' own errors
    unknown = {code: kind.__qualname__ for code, kind in refusals.items() if code not in _ERRORS}
    assert unknown == {}
    statuses = {code: (kind.status, _ERRORS[code].status) for code, kind in refusals.items()}
    differ = {code: pair for code, pair in statuses.items() if pair[0] != pair[1]}
    # the one refusal the gateway words differently: input to a closed stdin is the
    # caller's mistake there (400 bad_request, E2B's invalid_argument)
    assert differ == {"stdin_closed": (409, 400)}
