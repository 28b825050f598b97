"""The ``corral`` command: one module per group of commands.

* ``root``       the ``corral`` group; what client commands share (URL, keys, the SDK client)
* ``servers``    ``serve``, ``gateway``, ``node``, ``db upgrade``
* ``admin``      ``tenant``, ``key`` (admin key) and ``usage``
* ``functions``  ``run`` and ``functions`` (deploy, list, invoke)
* ``images``     ``images`` on this machine's store (no server)
* ``sandbox``    ``sandbox`` (create, exec, cp, ls, pause, resume, rm)
* ``invocations`` ``invocations`` (ls, get): the tenant's runs and function calls

Server commands build one ``Settings`` from ``CORRAL_*`` variables (flags override them);
client commands go through the ``corral`` SDK to ``CORRAL_URL`` with ``CORRAL_API_KEY``
(tenant commands) or ``CORRAL_ADMIN_KEY`` (admin commands).
"""

from __future__ import annotations

from app.cli import admin, functions, images, invocations, sandbox, servers
from app.cli.root import main

for _group in (servers, admin, functions, invocations, images, sandbox):
    for _command in _group.COMMANDS:
        main.add_command(_command)

__all__ = ["main"]
