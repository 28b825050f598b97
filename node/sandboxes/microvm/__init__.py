"""MicroVM sandboxes: QEMU ``-M microvm`` guests (docs/microvm.md), registered as the
``microvm`` backend (``node.sandboxes.microvm.backend``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from node.sandboxes.base import register

if TYPE_CHECKING:
    from node.sandboxes.microvm.backend import MicrovmBackend
    from node.settings import NodeSettings


def _create(settings: NodeSettings) -> MicrovmBackend:
    from node.sandboxes.microvm.backend import MicrovmBackend

    return MicrovmBackend(
        settings.data_dir,
        root=settings.sandbox_microvm_dir,
        accelerator=settings.sandbox_microvm_accelerator,
    )


register("microvm", _create)
