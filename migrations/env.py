"""alembic environment: runs on a connection handed over by rolltap, or opens one itself.

`rolltap db upgrade` and `rolltap.store.migrate` pass a connection in `config.attributes`;
plain `alembic -c migrations/alembic.ini ...` (for authors of new revisions) reads ROLLTAP_DB.
"""

from __future__ import annotations

import asyncio
import os

from alembic import context
from sqlalchemy import text
from sqlalchemy.engine import Connection

from rolltap.store.database import open_database
from rolltap.store.models import Base
from rolltap.store.url import resolve_url

# An arbitrary constant: concurrent `upgrade`s on PostgreSQL serialise on this advisory lock.
_PG_LOCK = 0x726F6C6C


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        compare_type=True,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            connection.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_LOCK})
        context.run_migrations()


async def _run_own_connection() -> None:
    database = open_database(resolve_url(os.environ.get("ROLLTAP_DB")))
    try:
        async with database.writer.connect() as conn:
            await conn.run_sync(_run)
            await conn.commit()
    finally:
        await database.dispose()


handed_over = context.config.attributes.get("connection")
if handed_over is not None:
    _run(handed_over)
else:
    asyncio.run(_run_own_connection())
