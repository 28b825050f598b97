"""deploy/wait_for_schema.py, the gateways' init container: it holds a gateway back until
the migration Job has brought a real PostgreSQL database to this release's head, and says
so when the database is ahead of the release."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ADMIN_KEY

pytestmark = [pytest.mark.postgres]

ROOT = Path(__file__).resolve().parents[2]


def _env(database_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    return {
        **env,
        "PYTHONPATH": str(ROOT),
        "CORRAL_ADMIN_KEY": ADMIN_KEY,
        "CORRAL_DATABASE_URL": database_url,
    }


def _wait(database_url: str, timeout: float = 1.0) -> subprocess.CompletedProcess[str]:
    script = str(ROOT / "deploy" / "wait_for_schema.py")
    return subprocess.run(
        [sys.executable, script, "--timeout", str(timeout), "--interval", "0.2"],
        env=_env(database_url),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _execute(database_url: str, sql: str) -> None:
    import asyncpg

    async def go() -> None:
        conn = await asyncpg.connect(database_url)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(go())


def test_it_waits_for_the_migrations_then_lets_the_gateway_start(postgres_url: str) -> None:
    before = _wait(postgres_url)
    assert before.returncode == 1, before.stderr
    assert "has the migration Job run?" in before.stderr

    upgraded = subprocess.run(
        [sys.executable, "-m", "app", "db", "upgrade"],
        env=_env(postgres_url),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert upgraded.returncode == 0, upgraded.stderr

    after = _wait(postgres_url)
    assert after.returncode == 0, after.stderr
    assert "schema at" in after.stderr


def test_a_database_ahead_of_the_release_is_named(postgres_url: str) -> None:
    _execute(postgres_url, "CREATE TABLE alembic_version (version_num varchar(32) PRIMARY KEY)")
    _execute(postgres_url, "INSERT INTO alembic_version VALUES ('ffffffffffff')")
    ahead = _wait(postgres_url)
    assert ahead.returncode == 2, ahead.stderr
    assert "newer than this release" in ahead.stderr


def test_an_unreachable_database_is_waited_for_not_fatal() -> None:
    from tests.integration.conftest import free_port

    gone = f"postgresql://postgres@127.0.0.1:{free_port()}/corral"
    waited = _wait(gone, timeout=0.5)
    assert waited.returncode == 1, waited.stderr
    assert "not reachable yet" in waited.stderr
