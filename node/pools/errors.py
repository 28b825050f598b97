"""Why a pool could not hand out a worker.

    PoolError
    ├── PoolClosed      the pool is closing or closed
    ├── PoolExhausted   no worker within the acquire timeout (every slot busy)
    └── StartFailed     a start did not finish within the start timeout

Any other failure of a start is the factory's own exception, raised unchanged to the
caller that waited for that start.
"""

from __future__ import annotations


class PoolError(RuntimeError):
    """The pool, not the worker or the code in it, failed."""


class PoolClosed(PoolError):
    pass


class PoolExhausted(PoolError):
    pass


class StartFailed(PoolError):
    pass
