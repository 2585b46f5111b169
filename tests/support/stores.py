"""Opening a store in a test: one place that connects and always closes it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from rolltap.store import Store


@asynccontextmanager
async def opened_store(url: str, *, read_only: bool = False) -> AsyncIterator[Store]:
    """The store at `url` (migrated to head unless `read_only`), closed when the block ends."""
    store = await Store.connect(url, read_only=read_only)
    try:
        yield store
    finally:
        await store.close()
