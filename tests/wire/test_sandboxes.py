"""The sandbox contracts' own rules: the network allow list's grammar
(``wire.sandboxes.NetworkPolicy``)."""

from __future__ import annotations

from ipaddress import IPv4Network

import pytest
from pydantic import ValidationError

from wire.sandboxes import NetworkPolicy, SandboxSpec, parse_destination


def test_none_is_no_entries_and_the_default() -> None:
    assert NetworkPolicy.model_validate("none").isolated
    spec = SandboxSpec(sandbox_id="s", tenant_id="t", image="python")
    assert spec.network.isolated and spec.network.allow == []


@pytest.mark.parametrize(
    ("entry", "network", "host", "port"),
    [
        ("10.0.0.1", "10.0.0.1/32", None, None),
        ("10.1.2.3/16:53", "10.1.0.0/16", None, 53),
        ("0.0.0.0/0:443", "0.0.0.0/0", None, 443),
        ("PyPI.org:443", None, "pypi.org", 443),
        ("files.pythonhosted.org.", None, "files.pythonhosted.org", None),
    ],
)
def test_entries_parse(entry: str, network: str | None, host: str | None, port: int | None) -> None:
    parsed = parse_destination(entry)
    assert parsed.network == (IPv4Network(network) if network else None)
    assert (parsed.host, parsed.port) == (host, port)


@pytest.mark.parametrize(
    "entry",
    ["1.2.3", "300.1.1.1", "[::1]:80", "::1", "x:0", "x:70000", "a:b", "under_score", "-a.b", ""],
)
def test_bad_entries_are_refused(entry: str) -> None:
    with pytest.raises(ValueError):
        parse_destination(entry)
    with pytest.raises(ValidationError):
        NetworkPolicy(allow=[entry])


def test_the_list_is_bounded() -> None:
    with pytest.raises(ValidationError):
        NetworkPolicy(allow=[f"10.0.0.{i}" for i in range(65)])
