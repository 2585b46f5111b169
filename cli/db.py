"""`rolltap db ...`: migrate and inspect the store's schema."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import click
from sqlalchemy.exc import DBAPIError

from ..store import migrate
from ..store.database import Database, open_database, unavailable
from ..store.url import resolve_url
from .options import db_option

T = TypeVar("T")


@click.group()
def db() -> None:
    """Manage the store's database schema."""


@db.command()
@db_option
def upgrade(db_url: str | None) -> None:
    """Apply every migration the database has not had yet."""

    async def run(database: Database) -> str | None:
        await migrate.upgrade(database)
        return await migrate.current_revision(database)

    revision = _with_database(db_url, run)
    click.echo(f"{resolve_url(db_url).render()} is at revision {revision} (head)")


@db.command()
@db_option
def current(db_url: str | None) -> None:
    """Print the database's revision and whether it is the newest."""
    revision = _with_database(db_url, migrate.current_revision, read_only=True)
    head = migrate.head_revision()
    state = "head" if revision == head else f"behind head {head}" if revision else "empty"
    click.echo(f"{revision or '-'} ({state})")


@db.command()
@db_option
def check(db_url: str | None) -> None:
    """Upgrade, then fail if the models and the migrated database disagree (CI runs this)."""

    async def run(database: Database) -> list[object]:
        await migrate.upgrade(database)
        return await migrate.differences(database)

    diffs = _with_database(db_url, run)
    if diffs:
        for diff in diffs:
            click.echo(f"  {diff}", err=True)
        raise click.ClickException("models and migrations disagree; generate a new revision")
    click.echo("models and migrations agree")


def _with_database(
    db_url: str | None, fn: Callable[[Database], Awaitable[T]], *, read_only: bool = False
) -> T:
    async def run() -> T:
        database = open_database(resolve_url(db_url), read_only=read_only)
        try:
            return await fn(database)
        except (DBAPIError, OSError) as e:
            raise unavailable(database.url, e) from e
        finally:
            await database.dispose()

    return asyncio.run(run())
