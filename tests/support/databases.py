"""Fresh databases for tests: a SQLite file per test, a PostgreSQL database per test.

PostgreSQL: one database per test run is migrated by alembic (so every run tests the
migrations), and each test gets a copy of it made with CREATE DATABASE ... TEMPLATE, which takes
a few milliseconds. Tests skip with the reason when no server answers on 127.0.0.1:5432.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import asyncpg

from tests.support.stores import opened_store

PG_ADMIN_DSN = os.environ.get("ROLLTAP_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


@dataclass
class PostgresServer:
    admin_dsn: str
    template: str
    host_part: str

    def fresh(self) -> str:
        name = f"rolltap_t_{uuid.uuid4().hex[:12]}"
        asyncio.run(self._execute(f'CREATE DATABASE "{name}" TEMPLATE "{self.template}"'))
        return name

    def drop(self, name: str) -> None:
        asyncio.run(self._execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))

    def url(self, name: str) -> str:
        return f"postgresql+asyncpg://{self.host_part}/{name}"

    async def _execute(self, sql: str) -> None:
        conn = await asyncpg.connect(self.admin_dsn)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()


def postgres_unavailable_reason() -> str | None:
    async def probe() -> None:
        conn = await asyncpg.connect(PG_ADMIN_DSN, timeout=3)
        await conn.close()

    try:
        asyncio.run(probe())
    except (OSError, asyncpg.PostgresError, TimeoutError) as e:
        return f"no PostgreSQL server answers at {PG_ADMIN_DSN}: {e}"
    return None


def start_postgres() -> Iterator[PostgresServer]:
    """Create and migrate the run's template database; drop it (and copies) at the end."""
    template = f"rolltap_tmpl_{uuid.uuid4().hex[:8]}"
    host_part = PG_ADMIN_DSN.split("://", 1)[1].rsplit("/", 1)[0]
    server = PostgresServer(PG_ADMIN_DSN, template, host_part)
    asyncio.run(server._execute(f'CREATE DATABASE "{template}"'))
    try:

        async def migrate() -> None:
            async with opened_store(server.url(template)):
                pass

        asyncio.run(migrate())
        yield server
    finally:
        server.drop(template)
