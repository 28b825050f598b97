"""Telling a lost database connection from a failed statement.

A statement that fails (a constraint, a bad value) failed: nothing it did is kept. A
connection that is lost (a restart, a failover, a network cut) is different for a write:
the commit may have reached the server and been made durable before the answer was lost,
so the write's outcome is unknown until the database can be asked again. Callers that must
not report "not recorded" for a write that was recorded (``app.invocations.service``) use
this to tell the two apart; ``app.http.errors`` uses it to answer 503 rather than 500.
"""

from __future__ import annotations

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError


def is_connection_failure(exc: BaseException) -> bool:
    """An error of the database's connection, not of the statement: SQLSTATE class 08
    (connection exception) or 57P (the server is shutting down or starting up), a
    connection SQLAlchemy invalidated, or the OS error of a connect that failed (asyncpg
    raises it unwrapped)."""
    if isinstance(exc, ConnectionError):
        return True
    if isinstance(exc, OperationalError | InterfaceError):
        return True
    if not isinstance(exc, DBAPIError):
        return False
    state = str(getattr(exc.orig, "sqlstate", None) or getattr(exc.orig, "pgcode", None) or "")
    return bool(exc.connection_invalidated) or state.startswith(("08", "57P"))
