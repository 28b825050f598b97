"""Keyless access has a listener of its own; the API listener always needs a key, and no
header or peer address changes either (finding 6: X-Forwarded-For made clients
"loopback")."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError
from starlette.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from tests.conftest import free_port, keyless_url

RUN = {"language": "fake", "code": json.dumps({"stdout": "ok"})}
FORGED = [
    {"X-Forwarded-For": "127.0.0.1"},
    {"X-Forwarded-For": "127.0.0.1", "X-Real-IP": "127.0.0.1", "Forwarded": "for=127.0.0.1"},
    {"X-Forwarded-For": "::1"},
]


@pytest.fixture
def servers(live_server: Callable[..., str]) -> tuple[str, str]:
    """(API URL, keyless URL) of one server with keyless access for tenant 'default'."""
    port = free_port()
    api = live_server(default_tenant="default", keyless_port=port)
    return api, keyless_url(port)


def test_the_keyless_listener_acts_as_the_default_tenant(servers: tuple[str, str]) -> None:
    _, keyless = servers
    response = httpx.post(f"{keyless}/run_code", json=RUN, timeout=30)
    assert response.status_code == 200, response.text
    assert response.json()["run_result"]["stdout"] == "ok"


def test_the_api_listener_needs_a_key_even_from_loopback(servers: tuple[str, str]) -> None:
    api, _ = servers
    response = httpx.post(f"{api}/run_code", json=RUN, timeout=30)
    assert response.status_code == 401, response.text
    error = response.json()["error"]
    assert error["code"] == "missing_api_key"
    assert "keyless listener" in error["message"]


@pytest.mark.parametrize("headers", FORGED)
def test_forwarded_headers_never_grant_keyless_access(
    servers: tuple[str, str], headers: dict[str, str]
) -> None:
    api, _ = servers
    response = httpx.post(f"{api}/run_code", json=RUN, headers=headers, timeout=30)
    assert response.status_code == 401, response.text


def test_nor_do_they_with_trusted_proxies(live_server: Callable[..., str]) -> None:
    """A trusted proxy may tell the client's address; that address decides nothing."""
    api = live_server(
        default_tenant="default", keyless_port=free_port(), trusted_proxies="127.0.0.1"
    )
    for headers in FORGED:
        response = httpx.post(f"{api}/run_code", json=RUN, headers=headers, timeout=30)
        assert response.status_code == 401, response.text


def test_the_keyless_mark_cannot_come_from_a_client(
    make_settings: Callable[..., Settings],
) -> None:
    """In-process (TestClient: peer 'testclient', any headers), only KeylessListener marks."""
    with TestClient(create_app(make_settings(default_tenant="default"))) as client:
        for headers in [*FORGED, {"corral.keyless": "true"}]:
            assert client.post("/run_code", json=RUN, headers=headers).status_code == 401


def test_proxy_headers_are_believed_only_from_configured_proxies(
    make_settings: Callable[..., Settings],
) -> None:
    from app.http.listeners import api_config

    app = create_app(make_settings())
    plain = api_config(app, make_settings())
    assert plain.proxy_headers is False
    proxied = api_config(app, make_settings(trusted_proxies="10.0.0.7, 10.1.0.0/16"))
    assert proxied.proxy_headers is True
    assert proxied.forwarded_allow_ips == ["10.0.0.7", "10.1.0.0/16"]


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"keyless_port": 9, "keyless_host": "0.0.0.0"}, "loopback"),
        ({"keyless_port": 9, "keyless_host": "192.168.1.5"}, "loopback"),
        ({"keyless_port": 9, "keyless_host": "localhost"}, "loopback"),
        ({"keyless_port": 9, "keyless_host": "::"}, "loopback"),
        ({"keyless_port": 9, "default_tenant": None}, "CORRAL_DEFAULT_TENANT"),
        ({"keyless_socket": "/tmp/x.sock", "default_tenant": None}, "CORRAL_DEFAULT_TENANT"),
        ({"trusted_proxies": "10.0.0.1,proxy.example"}, "CORRAL_TRUSTED_PROXIES"),
        ({"trusted_proxies": "*"}, "CORRAL_TRUSTED_PROXIES"),
    ],
)
def test_settings_refuse_unsafe_listeners(
    make_settings: Callable[..., Settings], overrides: dict[str, Any], words: str
) -> None:
    with pytest.raises(ValidationError, match=words):
        make_settings(**({"default_tenant": "default"} | overrides))


def test_the_keyless_listener_refuses_to_bind_a_non_loopback_address() -> None:
    """Past the settings' check too: the listener itself binds loopback addresses only."""
    from app.http.listeners import _tcp

    with pytest.raises(ValueError, match="loopback"), _tcp("0.0.0.0", 0):
        pass


def test_the_keyless_unix_socket_is_private(
    make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    path = tmp_path / "keyless.sock"
    path.touch()  # not a socket: refused
    with (
        pytest.raises(RuntimeError, match="not a socket"),
        TestClient(create_app(make_settings(default_tenant="default", keyless_socket=path))),
    ):
        pass
    path.unlink()
    old = os.umask(0)  # the socket is 0600 whatever the umask
    try:
        app = create_app(make_settings(default_tenant="default", keyless_socket=path))
        with TestClient(app):
            mode = os.stat(path).st_mode
            assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
            transport = httpx.HTTPTransport(uds=str(path))
            with httpx.Client(transport=transport, base_url="http://keyless") as client:
                response = client.post("/run_code", json=RUN, timeout=30)
            assert response.status_code == 200, response.text
            assert response.json()["run_result"]["stdout"] == "ok"
    finally:
        os.umask(old)
    assert not path.exists()


def test_the_api_listener_pings_idle_websockets_and_bounds_their_messages(
    make_settings: Callable[..., Settings],
) -> None:
    """A sandbox's terminal may be silent for long: the server pings it (a proxy keeps
    it, a vanished client is noticed) and takes messages of a bounded size."""
    from app.http.listeners import WS_MAX_BYTES, WS_PING_S, api_config

    settings = make_settings()
    config = api_config(create_app(settings), settings)
    assert config.ws_ping_interval == WS_PING_S and config.ws_ping_timeout == WS_PING_S
    assert config.ws_max_size == WS_MAX_BYTES
