"""What the ``corral`` command's tests share: no ``CORRAL_*`` variables of the
machine's, a real server on a free port, a tenant's key, and running the command."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import uvicorn
from click.testing import CliRunner, Result

from app.cli import main
from app.main import create_app
from app.settings import Settings
from tests.conftest import ADMIN_KEY


@pytest.fixture(autouse=True)
def _no_corral_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings and the CLI read CORRAL_* variables: start every test without them."""
    for name in list(os.environ):
        if name.startswith("CORRAL_") and not name.startswith("CORRAL_TEST_"):
            monkeypatch.delenv(name)


@pytest.fixture
def server_url(make_settings: Callable[..., Settings]) -> Iterator[str]:
    """A real Corral server (uvicorn, embedded stack, fake runtime) on a free port."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        create_app(make_settings()),
        log_level="warning",
        access_log=False,
        ws="none",
        lifespan="on",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert thread.is_alive(), "the server failed to start"
            assert time.monotonic() < deadline, "the server did not start in time"
            time.sleep(0.02)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
        assert not thread.is_alive(), "the server did not stop"


def corral(*args: str, **env: str | None) -> Result:
    return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)


def admin(url: str, *args: str, key: str = ADMIN_KEY) -> Result:
    return corral(*args, CORRAL_URL=url, CORRAL_ADMIN_KEY=key)


def assert_clean_error(result: Result, *fragments: str) -> None:
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith("Error: "), result.stderr
    for fragment in fragments:
        assert fragment in result.stderr
    assert "Traceback" not in result.output


@pytest.fixture
def api_key(server_url: str) -> str:
    created = admin(server_url, "tenant", "create", "runner")
    assert created.exit_code == 0, created.output
    return str(json.loads(created.stdout)["key"]["api_key"])
