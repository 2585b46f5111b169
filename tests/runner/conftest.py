"""Runner tests use a SQLite store; the store's own suite covers PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'store.sqlite'}"
