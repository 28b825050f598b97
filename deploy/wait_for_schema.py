"""Wait until the database schema is at the head revision of this release's migrations.

The gateways' init container (deploy/kubernetes/gateway.yaml): gateways run with
``CORRAL_RUN_MIGRATIONS=false`` and the migration Job (``corral db upgrade``) may not have
finished when they start. Reads ``CORRAL_DATABASE_URL`` (``app.db.migrate.schema_state``),
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

from app.db.engine import make_engine
from app.db.migrate import schema_state
from app.settings import DatabaseSettings

log = logging.getLogger("corral.wait_for_schema")


async def wait(url: str, timeout: float, interval: float) -> int:
    deadline = time.monotonic() + timeout
    while True:
        state = None
        engine = make_engine(url)
        try:
            state = await schema_state(engine)
        except Exception as exc:  # the database may not be up yet: keep waiting
            log.info("database not reachable yet: %s", exc)
        finally:
            await engine.dispose()
        if state is not None:
            if state.at_head:
                log.info("schema at %s", ", ".join(sorted(state.expected)))
                return 0
            if state.ahead:
                log.error(
                    "schema at %s is newer than this release (%s)",
                    sorted(state.current),
                    sorted(state.expected),
                )
                return 2
            log.info(
                "schema at %s, waiting for %s",
                sorted(state.current) or "nothing",
                sorted(state.expected),
            )
        if time.monotonic() >= deadline:
            log.error("schema not at head after %.0f s: has the migration Job run?", timeout)
            return 1
        await asyncio.sleep(interval)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds (default 300)")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between checks")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    settings = DatabaseSettings()
    sys.exit(asyncio.run(wait(settings.resolved_database_url, args.timeout, args.interval)))


if __name__ == "__main__":
    main()
