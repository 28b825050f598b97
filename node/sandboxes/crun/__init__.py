"""Container sandboxes on crun or runc (``node.sandboxes.crun.backend``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from node.sandboxes.base import register
from node.sandboxes.crun.backend import CrunBackend
from node.sandboxes.crun.lxcfs import Lxcfs
from node.sandboxes.crun.uidranges import UidRanges
from node.sandboxes.network import Network

if TYPE_CHECKING:
    from node.settings import NodeSettings


def _create(settings: NodeSettings) -> CrunBackend:
    # imported here: the settings module imports this package (the network's defaults)
    from node.settings import default_sandbox_memory_mb

    network = None
    if settings.sandbox_network_cidr is not None:
        network = Network(
            settings.sandbox_network_cidr,
            settings.sandbox_network_deny,
            resolvers=settings.sandbox_dns,
        )
    return CrunBackend(
        settings.data_dir,
        runtime=settings.sandbox_runtime,
        network=network,
        uid_ranges=UidRanges(
            settings.sandbox_uid_ranges_dir,
            first=settings.sandbox_uid_first,
            slots=settings.sandbox_uid_slots,
        ),
        user_namespaces=settings.sandbox_user_namespaces,
        lxcfs=Lxcfs(settings.sandbox_lxcfs_dir),
        # the placement budget may promise more than the host has (an operator's
        # overcommit); the kernel's bound over all sandboxes never does
        memory_limit_mb=min(
            settings.resolved_sandbox_memory_mb,
            default_sandbox_memory_mb(settings.memory_reserve_mb),
        ),
    )


register("crun", _create)
