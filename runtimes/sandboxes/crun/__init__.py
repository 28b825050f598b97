"""Container sandboxes on crun or runc (``runtimes.sandboxes.crun.backend``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from runtimes.sandboxes.base import register
from runtimes.sandboxes.crun.backend import CrunBackend

if TYPE_CHECKING:
    from runtimes.node.settings import NodeSettings


def _create(settings: NodeSettings) -> CrunBackend:
    return CrunBackend(settings.data_dir, runtime=settings.sandbox_runtime)


register("crun", _create)
