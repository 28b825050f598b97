"""Alembic migrations: up, down and up again on SQLite and PostgreSQL, and no drift
between the ORM models and what the migrations build."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Column, Integer, MetaData, String, inspect
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.engine import make_engine
from app.db.migrate import at_head, downgrade, upgrade
from app.db.models import Base
from app.settings import Settings

MODEL_TABLES = set(Base.metadata.tables)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database (a sync fixture: ``postgres_url`` runs its own event loop)."""
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path}/migrations.db"
    raw = request.getfixturevalue("postgres_url")
    url = Settings(dev_mode=True, database_url=raw).resolved_database_url
    assert url.startswith("postgresql+asyncpg://")
    return url


@pytest.fixture
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    engine = make_engine(database_url)
    try:
        yield engine
    finally:
        await engine.dispose()


async def _tables(engine: AsyncEngine) -> set[str]:
    async with engine.connect() as conn:
        return set(await conn.run_sync(lambda c: inspect(c).get_table_names()))


async def _revision(engine: AsyncEngine) -> str | None:
    def current(conn: Connection) -> str | None:
        return MigrationContext.configure(conn).get_current_revision()

    async with engine.connect() as conn:
        return await conn.run_sync(current)


async def _drift(engine: AsyncEngine, metadata: MetaData = Base.metadata) -> list[Any]:
    def diff(conn: Connection) -> list[Any]:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        return list(compare_metadata(context, metadata))

    async with engine.connect() as conn:
        return await conn.run_sync(diff)


def test_models_define_the_expected_tables() -> None:
    expected = {
        "tenants",
        "quotas",
        "api_keys",
        "functions",
        "function_versions",
        "function_artifacts",
        "invocations",
        "sandboxes",
        "usage_events",
        "usage_rollups",
        "blobs",
        "snapshots",
        "console_sessions",
        "dead_letters",
        "sandbox_totals",
        "tenant_images",
    }
    assert expected == MODEL_TABLES


async def test_upgrade_downgrade_upgrade(engine: AsyncEngine) -> None:
    assert await _tables(engine) == set()

    await upgrade(engine, "head")
    assert await _tables(engine) == MODEL_TABLES | {"alembic_version"}
    assert await _revision(engine) == "0016"

    await downgrade(engine, "base")
    assert await _tables(engine) == {"alembic_version"}
    assert await _revision(engine) is None

    await upgrade(engine, "head")
    assert await _tables(engine) == MODEL_TABLES | {"alembic_version"}
    assert await _revision(engine) == "0016"


async def test_upgrade_is_idempotent(engine: AsyncEngine) -> None:
    await upgrade(engine)
    await upgrade(engine)
    assert await _tables(engine) == MODEL_TABLES | {"alembic_version"}


async def test_a_database_at_head_is_not_migrated_again(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every gateway start but the first finds the schema at head: one query says so, and
    Alembic's upgrade (its scripts, the lock) does not run."""
    assert not await at_head(engine)
    await upgrade(engine, "0009")
    assert not await at_head(engine)
    await upgrade(engine)
    assert await at_head(engine)
    head = await _revision(engine)

    def refuse(*_args: Any, **_kwargs: Any) -> None:
        raise AssertionError("a database at head was migrated again")

    monkeypatch.setattr("app.db.migrate.command.upgrade", refuse)
    await upgrade(engine)
    assert head is not None and await _revision(engine) == head


async def test_no_drift_between_models_and_migrations(engine: AsyncEngine) -> None:
    await upgrade(engine, "head")
    assert await _drift(engine) == []


async def test_drift_check_notices_a_model_change(engine: AsyncEngine) -> None:
    """The drift check is not vacuous: a model changed without a migration is reported."""
    changed = MetaData(naming_convention=Base.metadata.naming_convention)
    for table in Base.metadata.sorted_tables:
        table.to_metadata(changed)
    changed.tables["invocations"].append_column(Column("priority", Integer, nullable=True))
    changed.tables["tenants"].c["name"].type = String(length=256)
    await upgrade(engine, "head")

    diffs = await _drift(engine, changed)

    added = [d for d in diffs if isinstance(d, tuple) and d[0] == "add_column"]
    assert [(d[2], d[3].name) for d in added] == [("invocations", "priority")]
    modified = [d[0] for d in diffs if isinstance(d, list)]
    assert [(m[0], m[2], m[3]) for m in modified] == [("modify_type", "tenants", "name")]


async def test_0003_keeps_quotas_usage_and_functions(engine: AsyncEngine) -> None:
    """Rows written under 0002 read the same under 0003, and back again on downgrade."""
    from datetime import UTC, datetime

    from sqlalchemy import text

    await upgrade(engine, "0002")
    limits = {
        "max_concurrent_executions": 3,
        "max_concurrent_sandboxes": 1,
        "executions_per_second": 5.0,
        "burst": 9,
        "cpu_seconds_per_day": 100.0,
        "max_memory_mb": 256,
        "max_wall_seconds": 20.0,
        "max_sandbox_lifetime_seconds": 60,
    }
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO tenants (id, name, disabled, created_at, updated_at) "
                "VALUES ('ten_1', 't', false, :now, :now)"
            ),
            {"now": datetime(2026, 11, 1, tzinfo=UTC)},
        )
        await conn.execute(
            text(
                "INSERT INTO quotas (tenant_id, updated_at, "
                + ", ".join(limits)
                + ") VALUES ('ten_1', '2026-11-01 00:00:00+00:00', :"
                + ", :".join(limits)
                + ")"
            ),
            limits,
        )
        await conn.execute(
            text(
                "INSERT INTO usage_rollups (tenant_id, day, kind, invocations, failures, "
                "queue_ms, setup_ms, exec_ms, teardown_ms, cpu_ms) "
                "VALUES ('ten_1', '2026-11-02', 'run', 7, 2, 1, 2, 3, 4, 5)"
            )
        )
        await conn.execute(
            text(
                "INSERT INTO functions (id, tenant_id, name, runtime, aliases, created_at) "
                "VALUES ('fn_1', 'ten_1', 'f', 'python', '{}', '2026-11-01 00:00:00+00:00')"
            )
        )

    await upgrade(engine, "0003")
    async with engine.connect() as conn:
        stored = (await conn.execute(text("SELECT limits FROM quotas"))).scalar_one()
        rollup = (await conn.execute(text("SELECT hour, events, cpu_ms FROM usage_rollups"))).one()
        language = (await conn.execute(text("SELECT language FROM functions"))).scalar_one()
    assert (stored if isinstance(stored, dict) else json.loads(stored)) == limits
    assert (rollup.events, rollup.cpu_ms) == (7, 5.0)
    assert str(rollup.hour).startswith("2026-11-02 00:00:00")
    assert language == "python"

    await downgrade(engine, "0002")
    async with engine.connect() as conn:
        burst = (await conn.execute(text("SELECT burst FROM quotas"))).scalar_one()
        day = (await conn.execute(text("SELECT invocations, cpu_ms FROM usage_rollups"))).one()
        runtime = (await conn.execute(text("SELECT runtime FROM functions"))).scalar_one()
    assert (burst, tuple(day), runtime) == (9, (7, 5.0), "python")


async def test_0008_keeps_rollups_under_empty_dimensions(engine: AsyncEngine) -> None:
    """Rollups written under 0007 keep their sums under 0008 (runtime, language and
    function ``""``), and fold back into one row per tenant, hour and kind on downgrade."""
    from sqlalchemy import text

    await upgrade(engine, "0007")
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO usage_rollups (tenant_id, hour, kind, events, failures, queue_ms,"
                " setup_ms, exec_ms, teardown_ms, cpu_ms, instance_seconds, memory_mb_seconds)"
                " VALUES ('ten_1', '2026-11-02 05:00:00+00:00', 'run', 7, 2, 1, 2, 3, 4, 5, 0, 0)"
            )
        )
    await upgrade(engine, "0008")
    async with engine.begin() as conn:
        row = (
            await conn.execute(
                text(
                    "SELECT runtime, language, function_version_id, events, cpu_ms, bytes_in"
                    " FROM usage_rollups"
                )
            )
        ).one()
        assert tuple(row) == ("", "", "", 7, 5.0, 0)
        await conn.execute(
            text(
                "INSERT INTO usage_rollups (tenant_id, hour, kind, runtime, language,"
                " function_version_id, events, failures, queue_ms, setup_ms, exec_ms,"
                " teardown_ms, cpu_ms, instance_seconds, memory_mb_seconds, bytes_in,"
                " bytes_out, retries) VALUES ('ten_1', '2026-11-02 05:00:00+00:00', 'run',"
                " 'nsjail', 'python', '', 3, 0, 0, 0, 0, 0, 10, 0, 0, 100, 200, 1)"
            )
        )
    await downgrade(engine, "0007")
    async with engine.connect() as conn:
        back = (await conn.execute(text("SELECT events, cpu_ms FROM usage_rollups"))).one()
    assert tuple(back) == (10, 15.0)
