"""alembic migrations build exactly the schema the models describe, on both databases."""

from __future__ import annotations

from click.testing import CliRunner

from rolltap.cli.main import cli
from rolltap.store import Store, migrate
from rolltap.store.events import Declared
from tests.support.stores import opened_store


async def test_migrated_database_matches_the_models(store: Store) -> None:
    assert await migrate.current_revision(store.db) == migrate.head_revision()
    assert await migrate.differences(store.db) == []


def test_db_commands(tmp_path: object) -> None:
    url = f"sqlite:///{tmp_path}/cli.sqlite"
    runner = CliRunner()

    # A read: it creates no SQLite file (an empty PostgreSQL database says "(empty)").
    missing = runner.invoke(cli, ["db", "current", "--db", url])
    assert missing.exit_code == 1, missing.output
    assert "no rolltap store at" in missing.output

    upgraded = runner.invoke(cli, ["db", "upgrade", "--db", url])
    assert upgraded.exit_code == 0, upgraded.output
    assert f"at revision {migrate.head_revision()} (head)" in upgraded.output

    current = runner.invoke(cli, ["db", "current"], env={"ROLLTAP_DB": url})
    assert current.output.strip() == f"{migrate.head_revision()} (head)"

    checked = runner.invoke(cli, ["db", "check", "--db", url])
    assert checked.exit_code == 0, checked.output
    assert "agree" in checked.output


def test_db_command_on_unreachable_server_is_one_clear_line() -> None:
    result = CliRunner().invoke(
        cli, ["db", "upgrade", "--db", "postgresql+asyncpg://bob:pw@127.0.0.1:1/x"]
    )
    assert result.exit_code == 1
    assert result.output.startswith("Error: cannot open the store at postgresql+asyncpg://bob:***@")
    assert "Traceback" not in result.output


async def test_succeeded_becomes_finished_and_back(store: Store) -> None:
    """The status-words migration rewrites stored rows both ways; expired exists only after it."""
    from alembic import command
    from sqlalchemy import text
    from sqlalchemy.engine import Connection

    from rolltap.store import RolloutStatus

    done = (await store.create_rollout()).id
    lost = (await store.create_rollout()).id
    await store.report(done, Declared(RolloutStatus.FINISHED), reward=0.0)
    await store.report(lost, Declared(RolloutStatus.EXPIRED))

    def move(conn: Connection, revision: str, *, down: bool) -> None:
        config = migrate.alembic_config()
        config.attributes["connection"] = conn
        (command.downgrade if down else command.upgrade)(config, revision)

    async def statuses() -> dict[str, str]:
        rows = await store.db.read(lambda c: c.execute(text("SELECT id, status FROM rollout")))
        return {row[0]: row[1] for row in rows}

    async def migrated(revision: str, *, down: bool) -> None:
        async with store.db.writer.connect() as conn:
            await conn.run_sync(move, revision, down=down)
            await conn.commit()

    await migrated("4114d9510933", down=True)
    assert await statuses() == {done: "succeeded", lost: "cancelled"}
    await migrated("head", down=False)
    assert await statuses() == {done: "finished", lost: "cancelled"}
    assert (await store.rollout(done)).status is RolloutStatus.FINISHED
    assert RolloutStatus("succeeded") is RolloutStatus.FINISHED, "old clients' word still reads"


async def test_every_check_constraint_of_the_models_is_in_the_migrated_schema(
    tmp_path: object,
) -> None:
    """alembic's comparison does not look at CHECK constraints: a value added to an enum without
    a migration fails only when a row carries it (a demo's answer_dropped break did). SQLite
    keeps each table's SQL, so the migrated schema's constraints are compared as text."""
    from sqlalchemy import CheckConstraint, text

    from rolltap.store.models import Base

    async with opened_store(f"sqlite:///{tmp_path}/checks.sqlite") as store:
        rows = await store.db.read(
            lambda c: c.execute(text("SELECT name, sql FROM sqlite_master WHERE type='table'"))
        )
        schema = {name: " ".join(sql.split()) for name, sql in rows}
    missing = [
        f"{table.name}: {check.sqltext}"
        for table in Base.metadata.tables.values()
        for check in table.constraints
        if isinstance(check, CheckConstraint)
        and " ".join(str(check.sqltext).split()) not in schema[table.name]
    ]
    assert not missing, missing


def test_the_newest_migration_file_is_the_head() -> None:
    # An open whose store is at this revision skips alembic (store/migrate.py): file names must
    # keep alembic.ini's file_template, date first and revision last.
    assert migrate.newest_revision() == migrate.head_revision()
