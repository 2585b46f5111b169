"""The schema revision this rolltap ships, read without alembic or SQLAlchemy."""

from __future__ import annotations

import functools
from pathlib import Path

from .. import migrations

VERSION_TABLE = "alembic_version"


@functools.cache
def newest_revision() -> str | None:
    """The revision of the newest file in migrations/versions/, read without alembic: their
    names begin with the date and end with the revision (alembic.ini's file_template), so the
    last name is the head (tests/store/test_migrations.py holds them to it)."""
    versions = Path(migrations.__file__).parent / "versions"
    names = sorted(p.stem for p in versions.glob("[0-9]*_*.py"))
    return names[-1].rsplit("_", 1)[1] if names else None
