"""Engines for one database: a writer and readers, with SQLite set up for safe concurrency."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Concatenate, ParamSpec, TypeVar

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import Connection as SyncConnection
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from .errors import DatabaseUnavailable
from .outage import describe, is_outage
from .url import DatabaseURL

BUSY_TIMEOUT_MS = 30_000
_SYNC_READERS = 4

P = ParamSpec("P")
T = TypeVar("T")


@dataclass
class Database:
    url: DatabaseURL
    writer: AsyncEngine
    """Schema changes and occasional writes; on SQLite it takes the write lock at BEGIN."""
    reader: AsyncEngine
    sync_writer: Engine | None = None
    """SQLite only: the group-commit writer's own connection, used from its one thread, so a
    whole batch costs one thread hop instead of one per statement (aiosqlite's way)."""
    sync_reader: Engine | None = None
    """SQLite only: `read` runs each query function on one of these connections in a thread of
    its own, one hop for the whole read where aiosqlite hops per statement, fetch and rollback
    (a proxy re-reads every active rollout every 2 s: that was ~1.5 ms of CPU each)."""
    _read_threads: ThreadPoolExecutor | None = field(default=None, repr=False)

    async def dispose(self) -> None:
        await self.writer.dispose()
        if self.reader.pool is not self.writer.pool:
            await self.reader.dispose()
        if self.sync_writer is not None:
            self.sync_writer.dispose()
        if self._read_threads is not None:
            self._read_threads.shutdown(wait=True)
            self._read_threads = None
        if self.sync_reader is not None:
            self.sync_reader.dispose()

    @contextlib.asynccontextmanager
    async def connect(self) -> AsyncIterator[AsyncConnection]:
        async with self.reader.connect() as conn:
            yield conn

    async def read(
        self, fn: Callable[Concatenate[SyncConnection, P], T], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """Run a query function (store.queries) in one read transaction."""
        try:
            if self.sync_reader is not None:
                if self._read_threads is None:
                    self._read_threads = ThreadPoolExecutor(
                        _SYNC_READERS, thread_name_prefix="rolltap-reader"
                    )
                call = functools.partial(_read_sync, self.sync_reader, fn, *args, **kwargs)
                return await asyncio.get_running_loop().run_in_executor(self._read_threads, call)
            async with self.reader.connect() as conn:
                return await conn.run_sync(lambda sync: fn(sync, *args, **kwargs))
        except Exception as e:
            if is_outage(e):
                raise DatabaseUnavailable(
                    f"the store at {self.url.render()} is unreachable: {describe(e)}"
                ) from e
            raise


def _read_sync(
    engine: Engine,
    fn: Callable[Concatenate[SyncConnection, P], T],
    *args: P.args,
    **kwargs: P.kwargs,
) -> T:
    with engine.connect() as conn:
        return fn(conn, *args, **kwargs)


def open_database(url: DatabaseURL, *, read_only: bool = False) -> Database:
    """Engines for `url`. `read_only`: one reader engine whose connections refuse every write
    (SQLite `query_only`, PostgreSQL read-only transactions) and nothing is created: a missing
    SQLite file is an error rather than a new store."""
    if read_only:
        return _read_only(url)
    if url.is_sqlite:
        path = url.sqlite_path
        if not path.parent.is_dir():
            if not url.embedded:
                raise DatabaseUnavailable(
                    f"cannot create the store {path}: {path.parent} is not a directory"
                )
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise DatabaseUnavailable(f"cannot create {path.parent} for the store: {e}") from e
        writer = _sqlite_engine(url, "BEGIN IMMEDIATE", pool_size=1)
        sync_writer = create_engine(
            url.url.set(drivername="sqlite+pysqlite"),
            pool_size=1,
            max_overflow=0,
            connect_args={"timeout": 30, "check_same_thread": False},
        )
        # Its checkpoints run on their own thread (store/checkpoint.py), not inside its commits.
        _configure_sqlite(
            sync_writer, "BEGIN IMMEDIATE", url.sqlite_synchronous, autocheckpoint=False
        )
        reader = _sqlite_engine(url, "BEGIN", pool_size=8)
        sync_reader = create_engine(
            url.url.set(drivername="sqlite+pysqlite"),
            pool_size=_SYNC_READERS,
            max_overflow=0,
            connect_args={"timeout": 30, "check_same_thread": False},
        )
        _configure_sqlite(sync_reader, "BEGIN", url.sqlite_synchronous)
        return Database(url, writer, reader, sync_writer, sync_reader)
    engine = create_async_engine(
        url.url, pool_size=10, max_overflow=20, pool_pre_ping=True, pool_recycle=1800
    )
    # A read of a rollout takes several statements (prompts, then choices); under READ
    # COMMITTED another process's commit could land between them. One snapshot per read.
    reader = engine.execution_options(isolation_level="REPEATABLE READ")
    return Database(url, engine, reader)


def _read_only(url: DatabaseURL) -> Database:
    if url.is_sqlite:
        if not url.sqlite_path.is_file():
            raise DatabaseUnavailable(
                f"no rolltap store at {url.sqlite_path} (`rolltap run`, `serve`, `demo` or "
                "`db upgrade` creates one)"
            )
        engine = create_async_engine(
            url.url, pool_size=8, max_overflow=2, connect_args={"timeout": 30}
        )
        _configure_sqlite_reader(engine.sync_engine)
        return Database(url, engine, engine)
    engine = create_async_engine(
        url.url,
        pool_size=4,
        max_overflow=4,
        pool_pre_ping=True,
        pool_recycle=1800,
        connect_args={"server_settings": {"default_transaction_read_only": "on"}},
    )
    reader = engine.execution_options(isolation_level="REPEATABLE READ")
    return Database(url, reader, reader)


def _sqlite_engine(url: DatabaseURL, begin: str, pool_size: int) -> AsyncEngine:
    engine = create_async_engine(
        url.url, pool_size=pool_size, max_overflow=2, connect_args={"timeout": 30}
    )
    _configure_sqlite(engine.sync_engine, begin, url.sqlite_synchronous)
    return engine


def _configure_sqlite(
    engine: Engine, begin: str, synchronous: str, *, autocheckpoint: bool = True
) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # pysqlite's implicit BEGIN breaks SAVEPOINT and transactional DDL; SQLAlchemy
        # documents this workaround: autocommit at the driver, BEGIN emitted by us.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        cursor.execute(f"PRAGMA synchronous={synchronous.upper()}")
        cursor.execute("PRAGMA foreign_keys=ON")
        if not autocheckpoint:
            cursor.execute("PRAGMA wal_autocheckpoint=0")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: SyncConnection) -> None:
        # IMMEDIATE on the writer: a deferred transaction that reads and then writes can fail
        # with SQLITE_BUSY at once when another process committed meanwhile.
        if conn.dialect.driver != "pysqlite":
            conn.exec_driver_sql(begin)
            return
        # Straight to the driver: Core's execution context and result around a BEGIN cost a
        # lone call's transaction a third of what SQLite spends on it. Its errors are
        # sqlite3's own, which the store reads as SQLAlchemy's (outage.py).
        cursor = conn.connection.cursor()
        try:
            cursor.execute(begin)
        finally:
            cursor.close()


def _configure_sqlite_reader(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # No journal_mode or synchronous pragma: those write to the file. query_only makes
        # SQLite itself refuse any statement that would change the database.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA query_only=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: SyncConnection) -> None:
        conn.exec_driver_sql("BEGIN")


def unavailable(url: DatabaseURL, e: DBAPIError | OSError) -> DatabaseUnavailable:
    """Translate a driver error met while connecting into one clear message (no password)."""
    reason = str(e.orig if isinstance(e, DBAPIError) else e).strip().splitlines()[0]
    hint = ""
    if isinstance(e, OperationalError) and url.is_sqlite:
        hint = " (is the directory writable?)"
    return DatabaseUnavailable(f"cannot open the store at {url.render()}: {reason}{hint}")
