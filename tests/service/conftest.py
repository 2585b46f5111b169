"""Rollout-service tests: a SQLite store, and a fake engine whose answers each test scripts."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'store.sqlite'}"
