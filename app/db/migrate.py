"""Run Alembic migrations from inside the application (startup, ``corral db upgrade``)."""

from __future__ import annotations

import logging
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

import migrations

log = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(migrations.__file__).parent


def alembic_config(url: str | None = None) -> Config:
    cfg = Config(str(MIGRATIONS_DIR / "alembic.ini"))
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    if url:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


async def upgrade(engine: AsyncEngine, revision: str = "head") -> None:
    def _upgrade(conn: Connection) -> None:
        cfg = alembic_config()
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)

    async with engine.begin() as conn:
        await conn.run_sync(_upgrade)
    log.info("database schema at %s", revision)


async def downgrade(engine: AsyncEngine, revision: str) -> None:
    def _downgrade(conn: Connection) -> None:
        cfg = alembic_config()
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, revision)

    async with engine.begin() as conn:
        await conn.run_sync(_downgrade)
