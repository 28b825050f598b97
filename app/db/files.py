"""The data directory and the embedded database's files: private to the server's user.

The data directory holds the SQLite database (every tenant's code, input, output and key
hashes), the generated admin key and the backends' caches. ``prepare`` makes it mode
0700 (creating it, or tightening an existing one), and a SQLite database file mode 0600:
it creates the file 0600 before SQLite opens it (SQLite gives its ``-wal``, ``-shm`` and
``-journal`` files the database file's mode; our lock files beside it are created 0600)
and sets every file already there whose name starts with the database's (``corral.db*``)
to 0600. Other databases (PostgreSQL) are not files of ours.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

from sqlalchemy.engine import make_url

DIR_MODE = 0o700
FILE_MODE = 0o600


def prepare(data_dir: Path, database_url: str) -> None:
    """Create or tighten ``data_dir`` and the SQLite file of ``database_url`` (if any)."""
    private_dir(data_dir)
    path = sqlite_file(database_url)
    if path is not None:
        private_database(path)


def private_dir(path: Path) -> None:
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    os.chmod(path, DIR_MODE)


def private_database(path: Path) -> None:
    os.close(os.open(path, os.O_CREAT | os.O_RDWR, FILE_MODE))
    for sibling in path.parent.glob(glob.escape(path.name) + "*"):
        if sibling.is_file() and not sibling.is_symlink():
            os.chmod(sibling, FILE_MODE)


def sqlite_file(database_url: str) -> Path | None:
    """The file of a SQLite URL (None: not SQLite, or in memory)."""
    url = make_url(database_url)
    if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:":
        return None
    return Path(url.database)
