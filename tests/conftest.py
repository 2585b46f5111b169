"""Fixtures shared by every suite: databases (SQLite and real PostgreSQL) and the store."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from rolltap.store import Store
from tests.support.databases import PostgresServer, postgres_unavailable_reason, start_postgres
from tests.support.engine import smollm_engine  # noqa: F401  (the real model, once a session)
from tests.support.stores import opened_store


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    reason = postgres_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    yield from start_postgres()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty database URL: a SQLite file, or a copy of the migrated PostgreSQL template."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.sqlite'}"
        return
    server: PostgresServer = request.getfixturevalue("postgres")
    name = server.fresh()
    try:
        yield server.url(name)
    finally:
        server.drop(name)


@pytest.fixture
async def store(db_url: str) -> AsyncIterator[Store]:
    async with opened_store(db_url) as opened:
        yield opened
