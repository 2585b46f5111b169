"""Schema migrations, run by alembic on the store's own connection.

Every open checks the store's revision. When it is the newest one this rolltap ships, the check
is one SELECT and alembic is never imported (alembic and its reading of every script were a
third of `rolltap ls`); any other revision goes through alembic's script directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection

from .. import migrations
from .database import Database
from .errors import StoreError
from .models import Base
from .revision import VERSION_TABLE as VERSION_TABLE
from .revision import newest_revision as newest_revision

if TYPE_CHECKING:
    from alembic.config import Config


class SchemaOutOfDate(StoreError):
    pass


def alembic_config() -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(Path(migrations.__file__).parent))
    return cfg


def head_revision() -> str | None:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config()).get_current_head()


async def upgrade(db: Database, revision: str = "head") -> None:
    async with db.writer.connect() as conn:
        await conn.run_sync(_upgrade, revision)
        await conn.commit()


async def current_revision(db: Database) -> str | None:
    return await db.read(_current)


async def differences(db: Database) -> list[Any]:
    """What alembic's autogenerate sees between the models and the migrated database."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    return await db.read(
        lambda c: compare_metadata(
            MigrationContext.configure(c, opts={"compare_type": True}), Base.metadata
        )
    )


async def ensure_schema(db: Database) -> None:
    """Migrate an empty database or a SQLite file; refuse to touch a stale shared server."""
    current = await current_revision(db)
    if current is not None and current == newest_revision():
        return
    head = _head()
    if current == head:
        return
    _refuse_unknown(db, current)
    if current is None or db.url.is_sqlite:
        await upgrade(db)
        return
    raise SchemaOutOfDate(
        f"the store at {db.url.render()} is at revision {current}, not {head}; "
        "run `rolltap db upgrade` once (it is not done implicitly on a shared server)"
    )


async def check_schema(db: Database) -> None:
    """For a store opened read-only: refuse, with the way out, anything but the current schema."""
    current = await current_revision(db)
    if current is not None and current == newest_revision():
        return
    head = _head()
    if current == head:
        return
    _refuse_unknown(db, current)
    if current is None:
        raise SchemaOutOfDate(
            f"{db.url.render()} holds no rolltap store (`rolltap db upgrade` creates one)"
        )
    raise SchemaOutOfDate(
        f"the store at {db.url.render()} is at revision {current}, not {head}; "
        "run `rolltap db upgrade` first"
    )


def _head() -> str:
    head = head_revision()
    if head is None:
        raise StoreError("rolltap's migrations are missing from this installation; reinstall it")
    return head


def _refuse_unknown(db: Database, current: str | None) -> None:
    if current is not None and current not in _known_revisions():
        raise SchemaOutOfDate(
            f"the store at {db.url.render()} is at revision {current}, which this rolltap does "
            "not know: it was migrated by a newer rolltap; upgrade rolltap"
        )


def _known_revisions() -> set[str]:
    from alembic.script import ScriptDirectory

    return {s.revision for s in ScriptDirectory.from_config(alembic_config()).walk_revisions()}


def _upgrade(conn: Connection, revision: str) -> None:
    from alembic import command

    cfg = alembic_config()
    cfg.attributes["connection"] = conn
    command.upgrade(cfg, revision)


def _current(conn: Connection) -> str | None:
    """What alembic's MigrationContext.get_current_revision reads, without loading alembic."""
    if not inspect(conn).has_table(VERSION_TABLE):
        return None
    rows = conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars().all()
    if len(rows) > 1:
        raise StoreError(f"the store has several schema heads: {', '.join(rows)}")
    return rows[0] if rows else None
