"""Alembic environment.

The application runs migrations on a connection it already holds
(``config.attributes["connection"]``, see ``app/db/migrate.py``); the Alembic CLI path
builds an engine from ``CORRAL_DATABASE_URL`` through the same settings object.
"""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy.engine import Connection

from app.db.models import Base

config = context.config
target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        compare_type=True,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


def _run_offline() -> None:
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        literal_binds=True,
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


async def _run_cli() -> None:
    from app.db.engine import make_engine
    from app.settings import DatabaseSettings

    url = config.get_main_option("sqlalchemy.url") or DatabaseSettings().resolved_database_url
    engine = make_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.run_sync(_run)
    finally:
        await engine.dispose()


if context.is_offline_mode():
    _run_offline()
elif (connection := config.attributes.get("connection")) is not None:
    _run(connection)
else:
    asyncio.run(_run_cli())
