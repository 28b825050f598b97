"""The ``e2b`` SDK's control plane against Corral on the fake sandbox backend: the
lifetime quota and the listing's filters (no containers needed)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from e2b import Sandbox, SandboxException, SandboxQuery, SandboxState

from tests.app.api.e2b.conftest import Corral


def _refused_with_400(exc: pytest.ExceptionInfo[SandboxException]) -> None:
    assert getattr(exc.value, "status_code", None) == 400
    assert "max_sandbox_lifetime_seconds" in str(exc.value)


def _left_s(sbx: Sandbox) -> float:
    return (sbx.get_info().end_at - datetime.now(UTC)).total_seconds()


def test_timeouts_past_the_lifetime_quota_are_refused_until_it_is_raised(
    fake_corral: Corral,
) -> None:
    fake_corral.quota(max_sandbox_lifetime_seconds=120)
    with pytest.raises(SandboxException) as too_long:
        Sandbox.create(template="python", timeout=600)
    _refused_with_400(too_long)
    sbx = Sandbox.create(template="python", timeout=60)
    with pytest.raises(SandboxException) as extended:
        sbx.set_timeout(600)
    _refused_with_400(extended)
    with pytest.raises(SandboxException) as connected:
        Sandbox.connect(sbx.sandbox_id, timeout=600)
    _refused_with_400(connected)
    assert _left_s(sbx) <= 60  # nothing was extended
    sbx.pause()
    with pytest.raises(SandboxException) as resumed:
        Sandbox.connect(sbx.sandbox_id, timeout=600)
    _refused_with_400(resumed)
    assert sbx.get_info().state == SandboxState.PAUSED  # refused before the resume

    fake_corral.quota(max_sandbox_lifetime_seconds=3600)
    Sandbox.connect(sbx.sandbox_id, timeout=600)
    assert _left_s(sbx) > 590
    sbx.set_timeout(900)
    assert _left_s(sbx) > 890
    assert sbx.kill() is True


def _listed(**query: object) -> set[str]:
    paginator = Sandbox.list(query=SandboxQuery(**query))  # type: ignore[arg-type]
    return {s.sandbox_id for s in paginator.next_items()}


def test_the_list_filters_on_metadata_and_state_as_the_sdk_sends_them(
    fake_corral: Corral,
) -> None:
    odd = {"user id": "a&b=c", "é": "100%"}  # quoted by the SDK, then URL-encoded
    first = Sandbox.create(template="python", metadata={"episode": "7"} | odd)
    second = Sandbox.create(template="python", metadata={"episode": "8"})
    second.pause()
    both = {first.sandbox_id, second.sandbox_id}
    assert _listed() == both
    assert _listed(metadata={"episode": "7"}) == {first.sandbox_id}
    assert _listed(metadata=odd) == {first.sandbox_id}
    assert _listed(metadata={"episode": "7", "user id": "x"}) == set()
    assert _listed(state=[SandboxState.PAUSED]) == {second.sandbox_id}
    assert _listed(state=[SandboxState.RUNNING]) == {first.sandbox_id}
    assert _listed(state=[SandboxState.RUNNING, SandboxState.PAUSED]) == both
    assert _listed(state=[SandboxState.RUNNING], metadata={"episode": "8"}) == set()

    pages = Sandbox.list(limit=1)
    seen = [s.sandbox_id for _ in range(3) if pages.has_next for s in pages.next_items()]
    assert sorted(seen) == sorted(both) and not pages.has_next
    for sbx in (first, second):
        assert sbx.kill() is True


def test_metadata_names_the_backend_and_one_no_node_offers_is_refused(
    fake_corral: Corral,
) -> None:
    sbx = Sandbox.create(template="python", metadata={"backend": "crun"})
    try:
        info = sbx.get_info()
        assert info.metadata["backend"] == "crun"
    finally:
        sbx.kill()
    with pytest.raises(SandboxException) as refused:
        Sandbox.create(template="python", metadata={"backend": "microvm"})
    assert "backend_not_offered" in str(refused.value) or "no node offers microvm" in str(
        refused.value
    )
    assert "crun" in str(refused.value)  # the backends on offer


def test_a_malformed_backend_in_metadata_is_a_4xx(fake_corral: Corral) -> None:
    with pytest.raises(SandboxException) as refused:
        Sandbox.create(template="python", metadata={"backend": "Not A Backend!"})
    assert getattr(refused.value, "status_code", None) == 422 or "422" in str(refused.value)
    assert "backend" in str(refused.value)
