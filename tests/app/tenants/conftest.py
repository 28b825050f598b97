"""The sandbox API's fixtures (``tests.app.api.v1.test_sandboxes``: the embedded node on
the fake backend, both stacks): a tenant to delete has sandboxes, invocations and
functions."""

from __future__ import annotations

from tests.app.api.v1.test_sandboxes import sandbox_client, sandbox_settings, tenant

__all__ = ["sandbox_client", "sandbox_settings", "tenant"]
