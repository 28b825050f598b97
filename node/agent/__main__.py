"""``python -m node.agent``: a node agent, without loading any of the control plane."""

from __future__ import annotations

import asyncio
import logging
import os

from common import lograte
from node.agent.main import run_node
from node.settings import NodeSettings


def configure_logging() -> None:
    logging.basicConfig(
        level=os.environ.get("CORRAL_LOG_LEVEL", "INFO").upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    lograte.install()  # a flood of one line (a tenant's calls, each refused) is summarised


def main() -> None:
    configure_logging()
    asyncio.run(run_node(NodeSettings()))


if __name__ == "__main__":
    main()
