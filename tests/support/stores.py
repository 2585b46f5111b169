"""Opening a store in a test: one place that connects and always closes it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from rolltap.store import Store


@asynccontextmanager
async def opened_store(
    url: str, *, read_only: bool = False, **options: Any
) -> AsyncIterator[Store]:
    """The store at `url` (migrated to head unless `read_only`), closed when the block ends;
    `options` go to Store.connect as they are (capacity, outage_limit, slow_after)."""
    store = await Store.connect(url, read_only=read_only, **options)
    try:
        yield store
    finally:
        await store.close()
