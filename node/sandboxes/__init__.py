"""Stateful sandboxes on a node: the backend seam, the backends, the manager, the API.

Importing the package registers the built-in backends (``crun``; ``fake`` for tests).
"""

from node.sandboxes import crun, fake, microvm  # noqa: F401  (registration)
