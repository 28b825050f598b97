"""Process limits a node sets on itself at start."""

from __future__ import annotations

import logging
import resource

log = logging.getLogger(__name__)

#: the most descriptors asked for when the hard limit is unlimited
MOST_FILES = 1 << 20


def raise_open_files_limit() -> int:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit (as Go's runtime and nginx do);
    the new soft limit. A node holds pipes and sockets for every running command, stream
    and connection: 1,024, a common soft default (systemd's for services), is reached by
    a burst of a few hundred sandbox commands. Jails and sandboxes set their own lower
    limits (``node/fncall/nsjail/config.py``, ``node/sandboxes/crun/bundle.py``)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = MOST_FILES if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-files limit from %d: %s", soft, exc)
            return soft
        log.info("open-files limit raised from %d to %d", soft, target)
        return target
    return soft
