"""alembic migrations build exactly the schema the models describe, on both databases."""

from __future__ import annotations

from click.testing import CliRunner

from rolltap.cli.main import cli
from rolltap.store import Store, migrate


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
