"""E2B compatibility: the ``e2b`` and ``e2b-code-interpreter`` SDKs, unchanged, on Corral.

Point ``E2B_API_URL`` and ``E2B_SANDBOX_URL`` at the gateway (``docs/e2b.md``). The
control plane (``control``) answers ``/sandboxes`` and ``/v2/sandboxes``; envd
(``envd``: Connect-RPC over ``connect``, ``/files``, ``/health``) and the code
interpreter (``interpreter``: ``/execute``, ``/contexts``) answer the in-sandbox calls
the SDKs send to the one sandbox URL with ``E2b-Sandbox-Id``. None of these paths
collides with Corral's own (``/v1/...``, ``/run_code``, ``/healthz``, ...). Who a request
acts as: ``auth``; how errors are answered: ``errors``.
"""

from __future__ import annotations

from starlette.routing import BaseRoute

from app.api.e2b import control, envd, interpreter


def routes() -> list[BaseRoute]:
    return [*control.routes(), *envd.routes(), *interpreter.routes()]
