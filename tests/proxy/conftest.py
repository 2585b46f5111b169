"""Proxy tests run on a SQLite store; test_postgres.py repeats the core paths on PostgreSQL
(the store's own suite covers both databases in depth)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.support.proxy import OpenAIFactory


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'store.sqlite'}"


@pytest.fixture
async def sdk() -> AsyncIterator[OpenAIFactory]:
    factory = OpenAIFactory()
    try:
        yield factory
    finally:
        await factory.close()
