"""Listings for a person at a terminal (`rolltap ls`): listing.py's SQL text run on a plain
sqlite3 connection when the store is a SQLite file at the newest schema, else on the store's
own connections (PostgreSQL, a URL with options, a store to be migrated: its usual errors).

sqlite3 alone starts in a tenth of the time SQLAlchemy's asyncio engine, its ORM and numpy
take to import (docs/scale.md, *Start-up and export*).
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Unpack

from . import listing
from .filters import FilterKeywords, RolloutFilter
from .records import BatchView, RolloutView
from .revision import VERSION_TABLE, newest_revision
from .url import plain_sqlite_file

if TYPE_CHECKING:
    from .reader import StoreReader

_BUSY_TIMEOUT_S = 30.0
"""As long as the store's own readers wait for a writer's lock (database.BUSY_TIMEOUT_MS)."""


class Listing:
    """Rollouts and batches as `StoreReader` lists them, through any `listing.Select`."""

    def __init__(self, select: listing.Select) -> None:
        self._select = select

    def rollouts(
        self, where: RolloutFilter | None = None, /, **keywords: Unpack[FilterKeywords]
    ) -> list[RolloutView]:
        return listing.rollouts(self._select, where, **keywords)

    def batches(self, **options: Any) -> list[BatchView]:
        return listing.batches(self._select, **options)

    def resolve(self, kind: listing.Kind, given: str) -> str:
        return listing.resolve_id(self._select, kind, given)


@contextlib.contextmanager
def open_listing(url: str | None) -> Iterator[Listing | StoreReader]:
    """The store at `url` (None: the embedded default), read-only."""
    plain = _plain_sqlite(url)
    if plain is None:
        from .reader import open as open_reader

        with open_reader(url, read_only=True) as reader:
            yield reader
        return
    with contextlib.closing(plain):
        yield Listing(lambda sql, params: _rows(plain, sql, params))


def _plain_sqlite(url: str | None) -> sqlite3.Connection | None:
    """A read-only connection to a plainly named SQLite store at the newest revision; None
    for anything else, which the store's own open handles (and explains, if it is wrong)."""
    path = plain_sqlite_file(url)
    if path is None or not path.is_file():
        return None
    try:
        # mode=rw: never create a file; query_only, as the store's read-only connections.
        conn = sqlite3.connect(
            f"{path.absolute().as_uri()}?mode=rw",
            uri=True,
            timeout=_BUSY_TIMEOUT_S,
            isolation_level=None,
        )
    except sqlite3.Error:
        return None
    try:
        conn.execute("PRAGMA query_only=ON")
        conn.execute("BEGIN")  # one snapshot for every query of the listing
        revision = conn.execute(f"SELECT version_num FROM {VERSION_TABLE}").fetchall()
    except sqlite3.Error:
        revision = []
    if revision != [(newest_revision(),)]:
        conn.close()
        return None
    return conn


def _rows(conn: sqlite3.Connection, sql: str, params: Mapping[str, Any]) -> Sequence[Any]:
    return conn.execute(sql, params).fetchall()
