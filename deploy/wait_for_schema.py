"""Wait until the database schema is at the head revision of this release's migrations.

The gateways' init container (deploy/kubernetes/gateway.yaml): gateways run with
``CORRAL_RUN_MIGRATIONS=false`` and the migration Job (``corral db upgrade``) may not have
finished when they start. Reads the gateway's own settings (``CORRAL_DATABASE_URL``, ...),
polls, and exits 0 at head, 1 when ``--timeout`` runs out (the kubelet then retries), 2 when
the database is ahead of this release (an older image against a newer schema).

    python deploy/wait_for_schema.py --timeout 300
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time

from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection

from app.db.engine import make_engine
from app.db.migrate import alembic_config
from app.settings import Settings

log = logging.getLogger("corral.wait_for_schema")


def expected_heads() -> set[str]:
    return set(ScriptDirectory.from_config(alembic_config()).get_heads())


async def current_heads(url: str) -> set[str]:
    def read(conn: Connection) -> set[str]:
        return set(MigrationContext.configure(conn).get_current_heads())

    engine = make_engine(url)
    try:
        async with engine.connect() as conn:
            return await conn.run_sync(read)
    finally:
        await engine.dispose()


def known_revisions() -> set[str]:
    return {rev.revision for rev in ScriptDirectory.from_config(alembic_config()).walk_revisions()}


async def wait(url: str, timeout: float, interval: float) -> int:
    want = expected_heads()
    known = known_revisions()
    deadline = time.monotonic() + timeout
    while True:
        try:
            have = await current_heads(url)
        except Exception as exc:  # the database may not be up yet: keep waiting
            have = None
            log.info("database not reachable yet: %s", exc)
        if have == want:
            log.info("schema at %s", ", ".join(sorted(want)))
            return 0
        if have and not have <= known:
            log.error("schema at %s is newer than this release (%s)", have, want)
            return 2
        if have is not None:
            log.info("schema at %s, waiting for %s", sorted(have) or "nothing", sorted(want))
        if time.monotonic() >= deadline:
            log.error("schema not at %s after %.0f s: has the migration Job run?", want, timeout)
            return 1
        await asyncio.sleep(interval)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds (default 300)")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between checks")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    settings = Settings()
    sys.exit(asyncio.run(wait(settings.resolved_database_url, args.timeout, args.interval)))


if __name__ == "__main__":
    main()
