"""Schema migrations, run by alembic on the store's own connection."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection

from .. import migrations
from .database import Database
from .errors import StoreError
from .models import Base


class SchemaOutOfDate(StoreError):
    pass


def alembic_config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(migrations.__file__).parent))
    return cfg


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


async def upgrade(db: Database, revision: str = "head") -> None:
    async with db.writer.connect() as conn:
        await conn.run_sync(_upgrade, revision)
        await conn.commit()


async def current_revision(db: Database) -> str | None:
    return await db.read(_current)


async def differences(db: Database) -> list[Any]:
    """What alembic's autogenerate sees between the models and the migrated database."""
    return await db.read(
        lambda c: compare_metadata(
            MigrationContext.configure(c, opts={"compare_type": True}), Base.metadata
        )
    )


async def ensure_schema(db: Database) -> None:
    """Migrate an empty database or a SQLite file; refuse to touch a stale shared server."""
    head = _head()
    current = await current_revision(db)
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
    head = _head()
    current = await current_revision(db)
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
    return {s.revision for s in ScriptDirectory.from_config(alembic_config()).walk_revisions()}


def _upgrade(conn: Connection, revision: str) -> None:
    cfg = alembic_config()
    cfg.attributes["connection"] = conn
    command.upgrade(cfg, revision)


def _current(conn: Connection) -> str | None:
    return MigrationContext.configure(conn).get_current_revision()
