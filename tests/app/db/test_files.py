"""The data directory and the embedded database are private to the server's user
(finding 10: var/ was 0755 and var/corral.db 0644)."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from starlette.testclient import TestClient

from app.cli import main
from app.main import create_app
from app.settings import Settings


@pytest.fixture(autouse=True)
def _permissive_umask() -> Iterator[None]:
    """The common default: files 0644 and directories 0755 unless the code says otherwise."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _assert_private(data_dir: Path) -> None:
    assert _mode(data_dir) == 0o700
    files = sorted(data_dir.glob("corral.db*"))
    assert data_dir / "corral.db" in files
    for path in files:
        assert _mode(path) == 0o600, f"{path.name} is {oct(_mode(path))}"


def test_the_server_creates_a_private_data_dir_and_database(
    make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    data_dir = tmp_path / "fresh" / "var"
    with TestClient(create_app(make_settings(data_dir=data_dir))) as client:
        assert client.post("/v1/tenants", json={"name": "t"}, headers=_admin()).status_code == 201
        assert (data_dir / "corral.db-wal").exists()  # written since: SQLite made it
        _assert_private(data_dir)
    _assert_private(data_dir)


def test_the_server_tightens_an_existing_world_readable_one(
    make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    data_dir = tmp_path / "var"
    with TestClient(create_app(make_settings(data_dir=data_dir))):
        pass
    os.chmod(data_dir, 0o755)
    for path in data_dir.glob("corral.db*"):
        os.chmod(path, 0o644)
    with TestClient(create_app(make_settings(data_dir=data_dir))):
        _assert_private(data_dir)


def test_db_upgrade_makes_them_private(tmp_path: Path) -> None:
    data_dir = tmp_path / "var"
    data_dir.mkdir(mode=0o755)
    result = CliRunner().invoke(
        main, ["db", "upgrade"], env={"CORRAL_DATA_DIR": str(data_dir), "CORRAL_DATABASE_URL": None}
    )
    assert result.exit_code == 0, result.output
    _assert_private(data_dir)


def _admin() -> dict[str, str]:
    from tests.conftest import ADMIN

    return ADMIN
