"""Server commands and the settings they build: weak admin keys refused, a node needs
only Redis, ``db upgrade``."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from app.settings import MIN_ADMIN_KEY_LENGTH, Settings
from node.settings import NodeSettings
from tests.app.cli.conftest import corral

STRONG_KEY = "k3y-" + "Zq8" * 10


# --- settings -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "admin_key",
    [None, "", "changeme", "CHANGEME", "secret", "short-" + "x" * (MIN_ADMIN_KEY_LENGTH - 7)],
    ids=["missing", "empty", "changeme", "CHANGEME", "secret", "short"],
)
def test_settings_refuse_a_weak_admin_key_outside_dev_mode(admin_key: str | None) -> None:
    with pytest.raises(ValidationError, match="CORRAL_ADMIN_KEY must be set"):
        Settings(dev_mode=False, admin_key=admin_key)


def test_node_settings_refuse_the_fake_runtime_outside_dev_mode() -> None:
    with pytest.raises(ValidationError, match="fake runtime is for tests only"):
        NodeSettings(dev_mode=False, runtimes=["fake"])
    with pytest.raises(ValidationError, match="fake runtime"):
        NodeSettings(dev_mode=False, runtimes=["nsjail", "fake"])
    assert NodeSettings(dev_mode=True, runtimes=["fake"]).runtimes == ["fake"]


def test_failpoints_need_dev_mode() -> None:
    with pytest.raises(ValidationError, match="CORRAL_FAILPOINTS needs CORRAL_DEV_MODE"):
        Settings(dev_mode=False, admin_key=STRONG_KEY, failpoints={"x": "kill"})
    assert Settings(dev_mode=True, failpoints={"x": "kill"}).failpoints == {"x": "kill"}


def test_settings_accept_a_strong_admin_key() -> None:
    settings = Settings(dev_mode=False, admin_key=STRONG_KEY)
    assert settings.admin_key is not None
    assert settings.admin_key.get_secret_value() == STRONG_KEY
    assert STRONG_KEY not in repr(settings)  # a secret, never printed
    exactly_long_enough = "a" * MIN_ADMIN_KEY_LENGTH
    assert Settings(dev_mode=False, admin_key=exactly_long_enough).admin_key is not None


def test_settings_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CORRAL_ADMIN_KEY", "changeme")
    with pytest.raises(ValidationError, match="CORRAL_ADMIN_KEY"):
        Settings()
    monkeypatch.setenv("CORRAL_ADMIN_KEY", STRONG_KEY)
    assert Settings().admin_key is not None
    monkeypatch.setenv("CORRAL_RUNTIMES", '["fake"]')
    with pytest.raises(ValidationError, match="fake runtime"):
        Settings()  # the embedded node's settings are read with the gateway's
    monkeypatch.setenv("CORRAL_DEV_MODE", "1")
    monkeypatch.setenv("CORRAL_ADMIN_KEY", "")
    monkeypatch.setenv("CORRAL_NODE_SLOTS", "3")
    settings = Settings()  # dev mode allows both
    assert settings.node.runtimes == ["fake"] and settings.node.node_slots == 3


def test_dev_mode_allows_no_admin_key() -> None:
    assert Settings(dev_mode=True).admin_key is None


def test_resolved_database_url() -> None:
    pg = Settings(dev_mode=True, database_url="postgresql://u@h:5/db").resolved_database_url
    assert pg == "postgresql+asyncpg://u@h:5/db"
    assert Settings(dev_mode=True, database_url="postgres://h/db").resolved_database_url == (
        "postgresql+asyncpg://h/db"
    )
    lite = Settings(dev_mode=True, database_url="sqlite:////tmp/x.db").resolved_database_url
    assert lite == "sqlite+aiosqlite:////tmp/x.db"
    default = Settings(dev_mode=True).resolved_database_url
    assert default.startswith("sqlite+aiosqlite:///") and default.endswith("/corral.db")


def test_server_commands_refuse_a_weak_admin_key_cleanly() -> None:
    for command in ("serve", "gateway"):
        result = corral(command, CORRAL_ADMIN_KEY="changeme", CORRAL_RUNTIMES='["nsjail"]')
        assert result.exit_code == 2, (command, result.output)
        assert "CORRAL_ADMIN_KEY must be set" in result.stderr
        assert "Traceback" not in result.output


def test_node_needs_only_a_redis_url() -> None:
    """A node is told no database and no admin key; without Redis it says what it lacks."""
    result = corral("node", CORRAL_ADMIN_KEY="changeme", CORRAL_RUNTIMES='["nsjail"]')
    assert result.exit_code == 2, result.output
    assert "needs CORRAL_REDIS_URL" in result.stderr
    assert "ADMIN_KEY" not in result.stderr and "Traceback" not in result.output
    fields = set(NodeSettings.model_fields)
    assert not fields & {"database_url", "admin_key", "run_migrations"}


def test_db_upgrade_command(tmp_path: Any) -> None:
    result = corral("db", "upgrade", CORRAL_DEV_MODE="1", CORRAL_DATA_DIR=str(tmp_path))
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "database at head"
    assert (tmp_path / "corral.db").exists()
