"""Which database: URL normalisation and the embedded default (a SQLite file per user)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import platformdirs

from .errors import BadDatabaseURL

# SQLAlchemy is imported by the functions that build its URL: `plain_sqlite_file` and
# `DatabaseURL`'s readers need none of it.
if TYPE_CHECKING:
    from sqlalchemy.engine import URL

_SUPPORTED = "sqlite:///PATH, sqlite+aiosqlite:///PATH, postgresql+asyncpg://USER@HOST/DB"


_SYNCHRONOUS = ("normal", "full")
_SQLITE_SUFFIXES = (".sqlite", ".sqlite3", ".db")
_PLAIN_SQLITE = ("sqlite:///", "sqlite+aiosqlite:///", "sqlite+pysqlite:///")


@dataclass(frozen=True)
class DatabaseURL:
    url: URL
    """The async SQLAlchemy URL (aiosqlite or asyncpg)."""
    sqlite_synchronous: str = "normal"
    """WAL + NORMAL keeps every acknowledged commit across a crash of the process; FULL
    (`?synchronous=full` on the URL) also across power loss, at an fsync per commit."""
    embedded: bool = False
    """The default SQLite file in the user's data directory, whose folder rolltap may create;
    for a path the user named, a missing folder is a mistake to report, not to paper over."""

    @property
    def is_sqlite(self) -> bool:
        return self.url.get_backend_name() == "sqlite"

    @property
    def sqlite_path(self) -> Path:
        assert self.url.database is not None
        return Path(self.url.database)

    def render(self) -> str:
        """The URL for logs and messages: never with its password."""
        return self.url.render_as_string(hide_password=True)


def default_sqlite_path() -> Path:
    return platformdirs.user_data_path("rolltap") / "rolltap.sqlite"


def plain_sqlite_file(raw: str | None) -> Path | None:
    """The SQLite file `raw` names when it names one plainly (the default, a bare path, or
    sqlite:///PATH without options), found without SQLAlchemy (`rolltap ls` reads such a
    store with sqlite3 alone); None for anything else, which `resolve_url` reads."""
    if not raw:
        return default_sqlite_path()
    if "://" not in raw:
        # A bare path is the friendliest way to name a SQLite file, but a typo must not become
        # a new database: only an existing file or a SQLite-looking name is taken as one.
        path = Path(raw).expanduser()
        return path if path.exists() or path.suffix in _SQLITE_SUFFIXES else None
    for scheme in _PLAIN_SQLITE:
        rest = raw.removeprefix(scheme)
        if rest != raw and rest and rest != ":memory:" and not set(rest) & set("?#%@"):
            return Path(rest).expanduser()
    return None


def resolve_url(raw: str | None) -> DatabaseURL:
    """Turn a flag/env value into an async URL; None or "" selects the embedded default."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    if not raw:
        return _sqlite(default_sqlite_path(), embedded=True)
    if "://" not in raw:
        path = plain_sqlite_file(raw)
        if path is None:
            raise BadDatabaseURL(
                f"{raw!r} is not a database URL; expected one of {_SUPPORTED} "
                f"(or a path ending in {', '.join(_SQLITE_SUFFIXES)})"
            )
        return _sqlite(path)
    try:
        url = make_url(raw)
    except ArgumentError as e:
        raise BadDatabaseURL(f"malformed database URL ({e}); expected one of {_SUPPORTED}") from e
    backend = url.get_backend_name()
    if backend not in ("sqlite", "postgresql", "postgres"):
        raise BadDatabaseURL(
            f"unsupported database {backend!r} in {url.render_as_string()}; "
            f"expected one of {_SUPPORTED}"
        )
    driver = url.get_driver_name()
    if backend == "sqlite":
        if driver not in ("pysqlite", "aiosqlite"):
            raise BadDatabaseURL(f"unsupported SQLite driver {driver!r}; use sqlite+aiosqlite://")
        synchronous = str(url.query.get("synchronous", "normal")).lower()
        if synchronous not in _SYNCHRONOUS:
            raise BadDatabaseURL(f"synchronous={synchronous!r}: use one of {_SYNCHRONOUS}")
        if not url.database or url.database == ":memory:":
            raise BadDatabaseURL(
                "an in-memory SQLite database cannot be shared between connections; "
                "give a file path: sqlite:///path/to/rolltap.sqlite"
            )
        return _sqlite(Path(url.database).expanduser(), synchronous)
    if backend in ("postgresql", "postgres"):
        if driver not in ("asyncpg", "psycopg2", "psycopg"):
            raise BadDatabaseURL(
                f"unsupported PostgreSQL driver {driver!r}; use postgresql+asyncpg://"
            )
        if not url.database:
            raise BadDatabaseURL(f"the URL {url.render_as_string()} names no database")
    return DatabaseURL(url.set(drivername="postgresql+asyncpg"))


def _sqlite(path: Path, synchronous: str = "normal", *, embedded: bool = False) -> DatabaseURL:
    from sqlalchemy.engine import URL

    path = path.absolute()
    if path.exists() and path.is_dir():
        raise BadDatabaseURL(f"{path} is a directory; give the path of a SQLite file")
    url = URL.create("sqlite+aiosqlite", database=str(path))
    return DatabaseURL(url, synchronous, embedded)
