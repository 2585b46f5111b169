"""Whether a failed database operation means the database is away rather than the write is bad.

An outage (the server stopped, restarting, unreachable, out of connections; a SQLite file that is
locked, read-only or on a failing disk) is worth waiting out: the same transaction will commit
once the database is back. Anything else (a constraint, a type, a bug) will fail again, so the
writer isolates it instead of retrying it.
"""

from __future__ import annotations

import errno
import sqlite3
import sys

from sqlalchemy.exc import DBAPIError

# SQLite reports all of these as OperationalError; the message tells them from a bad statement.
_SQLITE_OUTAGE = (
    "database is locked",
    "database table is locked",
    "readonly database",
    "disk i/o error",
    "unable to open database file",
    "database or disk is full",
)


def is_outage(error: BaseException) -> bool:
    if isinstance(error, DBAPIError):
        if error.connection_invalidated:
            return True
        return is_outage(error.orig) if error.orig is not None else False
    if isinstance(error, (OSError, *_pg_outage())):
        return True
    if isinstance(error, sqlite3.OperationalError):
        message = str(error).lower()
        return any(marker in message for marker in _SQLITE_OUTAGE)
    cause = error.__cause__
    # SQLAlchemy's asyncpg adapter wraps the driver's error; the original is the cause.
    return cause is not None and cause is not error and is_outage(cause)


# What a full disk says: SQLite's SQLITE_FULL, PostgreSQL's 53100 disk_full (it cannot extend a
# relation or write its WAL), the OS's own ENOSPC or a quota.
_FULL_TEXT = ("database or disk is full", "no space left on device", "could not extend file")
_FULL_ERRNO = (errno.ENOSPC, errno.EDQUOT)


def is_full(error: BaseException) -> bool:
    """Whether an outage is a full disk: it will not pass by waiting a few seconds, so new calls
    are refused until a write goes through again (store/writer.py)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in _FULL_ERRNO:
            return True
        if getattr(current, "sqlstate", None) == "53100":  # asyncpg's DiskFullError
            return True
        if any(marker in str(current).lower() for marker in _FULL_TEXT):
            return True
        original = current.orig if isinstance(current, DBAPIError) else None
        current = original if original is not None else current.__cause__
    return False


def _pg_outage() -> tuple[type[BaseException], ...]:
    """asyncpg's own errors that mean "no usable connection": connection class 08, operator
    intervention 57P0x (admin/crash shutdown, cannot connect now), insufficient resources 53xxx.
    Only a loaded asyncpg can have raised them, so a SQLite store never imports it."""
    asyncpg = sys.modules.get("asyncpg")
    if asyncpg is None:
        return ()
    return (
        asyncpg.PostgresConnectionError,
        asyncpg.exceptions.OperatorInterventionError,
        asyncpg.exceptions.InsufficientResourcesError,
        asyncpg.InterfaceError,
    )


def describe(error: BaseException) -> str:
    """One line for logs and /health: the driver's own words, no URL or password."""
    original = error.orig if isinstance(error, DBAPIError) and error.orig is not None else error
    text = str(original).strip().splitlines()[0] if str(original).strip() else ""
    return f"{type(original).__name__}: {text}"[:200]
