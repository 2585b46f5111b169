"""Database URLs: the embedded default, normalisation, and clear errors for bad ones."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rolltap.store import BadDatabaseURL, DatabaseUnavailable, Store, resolve_url
from rolltap.store.url import plain_sqlite_file

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("sqlite:////tmp/a.sqlite", "sqlite+aiosqlite:////tmp/a.sqlite"),
        ("sqlite+aiosqlite:////tmp/a.sqlite", "sqlite+aiosqlite:////tmp/a.sqlite"),
        ("/tmp/b.sqlite", "sqlite+aiosqlite:////tmp/b.sqlite"),
        ("postgresql+asyncpg://u@h:5432/db", "postgresql+asyncpg://u@h:5432/db"),
        ("postgresql://u@h/db", "postgresql+asyncpg://u@h/db"),
    ],
)
def test_urls_are_normalised_to_async_drivers(raw: str, expected: str) -> None:
    assert resolve_url(raw).render() == expected


@pytest.mark.parametrize(
    "raw",
    [
        None,
        "sqlite:////tmp/a.sqlite",
        "sqlite+aiosqlite:///relative/b.db",
        "sqlite+pysqlite:///~/c.sqlite",
        "/tmp/d.sqlite3",
        "e.sqlite",
    ],
)
def test_a_plainly_named_sqlite_file_is_found_without_sqlalchemy_as_resolve_url_finds_it(
    raw: str | None,
) -> None:
    path = plain_sqlite_file(raw)

    assert path is not None
    assert path.absolute() == resolve_url(raw).sqlite_path


@pytest.mark.parametrize(
    "raw",
    [
        "sqlite:////tmp/a.sqlite?synchronous=full",
        "sqlite:///:memory:",
        "sqlite://",
        "postgresql://u@h/db",
        "not-a-url",
    ],
)
def test_anything_else_is_left_to_resolve_url(raw: str) -> None:
    assert plain_sqlite_file(raw) is None


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("mysql://u@h/db", "unsupported database 'mysql'"),
        ("sqlite://", "in-memory"),
        ("sqlite:///:memory:", "in-memory"),
        ("postgresql://u@h", "names no database"),
        ("postgresql+pg8000://u@h/db", "unsupported PostgreSQL driver"),
        ("://nonsense", "malformed"),
        ("foo://bar", "unsupported database 'foo'"),
        ("notaurl", "'notaurl' is not a database URL"),
    ],
)
def test_bad_urls_are_refused_clearly(raw: str, message: str) -> None:
    with pytest.raises(BadDatabaseURL, match=message):
        resolve_url(raw)


def test_a_directory_is_not_a_database(tmp_path: Path) -> None:
    with pytest.raises(BadDatabaseURL, match="is a directory"):
        resolve_url(str(tmp_path))


async def test_unreachable_server_names_the_url_without_password() -> None:
    with pytest.raises(DatabaseUnavailable) as caught:
        await Store.connect("postgresql+asyncpg://alice:s3cret-pw@127.0.0.1:1/rolltap")
    assert "127.0.0.1:1/rolltap" in str(caught.value)
    assert "s3cret-pw" not in str(caught.value)


async def test_unwritable_sqlite_location_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(DatabaseUnavailable, match="is not a directory"):
        await Store.connect(f"sqlite:///{blocker}/sub/store.sqlite")
    assert blocker.read_text() == "not a directory"


def test_embedded_default_is_created_on_first_write_never_by_a_read(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "data"), "HOME": str(tmp_path)}
    env.pop("ROLLTAP_DB", None)

    def rolltap(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "rolltap.cli.main", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )

    listed = rolltap("ls")
    assert listed.returncode == 1
    assert not (tmp_path / "data").exists()
    upgraded = rolltap("db", "upgrade")
    assert upgraded.returncode == 0, upgraded.stderr
    assert (tmp_path / "data" / "rolltap" / "rolltap.sqlite").is_file()
    listed = rolltap("ls")
    assert (listed.returncode, listed.stderr) == (0, "no rollouts yet\n")
