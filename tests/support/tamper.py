"""An attacker's SQL: edits a store's rows directly, foreign keys and all checks switched off.

SQLite: its own connection (foreign keys are off unless a connection turns them on).
PostgreSQL: `session_replication_role = replica`, as a superuser skipping constraint triggers.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from rolltap.store.url import resolve_url


async def tamper(db_url: str, sql: str, **params: Any) -> int:
    """Run one statement outside rolltap; returns the rows it touched."""
    engine = create_async_engine(resolve_url(db_url).url)
    try:
        async with engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                await conn.execute(text("SET LOCAL session_replication_role = replica"))
            result = await conn.execute(text(sql), params)
            return result.rowcount
    finally:
        await engine.dispose()


async def fetch(db_url: str, sql: str, **params: Any) -> Any:
    """The first column of the first row of a query, read outside rolltap."""
    engine = create_async_engine(resolve_url(db_url).url)
    try:
        async with engine.connect() as conn:
            return (await conn.execute(text(sql), params)).scalar()
    finally:
        await engine.dispose()
