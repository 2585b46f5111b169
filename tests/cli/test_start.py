"""What `rolltap ls` and `rolltap show` load: rows from a store whose schema is current, and
neither alembic nor the network and export libraries (bench/cli_bench.py times them)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from rolltap.store import NewRollout, Store

_PROBE = """
import json, sys
from rolltap.cli.main import cli
try:
    cli(sys.argv[1:])
except SystemExit as e:
    assert not e.code, e.code
print(json.dumps(sorted(sys.modules)), file=sys.stderr)
"""
_HEAVY = ("alembic", "aiohttp", "asyncpg", "pyarrow")


def _loaded(*argv: str) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, *argv], check=True, capture_output=True, text=True
    )
    return set(json.loads(done.stderr.splitlines()[-1]))


async def _one_rollout(tmp_path: Path) -> tuple[str, str]:
    url = f"sqlite:///{tmp_path}/cli.sqlite"
    store = await Store.connect(url)
    created = await store.create_rollout(NewRollout(batch_id="b", task_id="t"))
    await store.update_rollout(created.id, status="finished", reward=1.0)
    await store.close()
    return url, created.id


async def test_listing_rollouts_loads_no_migrations_analysis_or_audit(tmp_path: Path) -> None:
    url, _ = await _one_rollout(tmp_path)

    loaded = _loaded("ls", "--db", url)

    unneeded = (*_HEAVY, "rolltap.audit", "rolltap.analysis.trajectory", "rolltap.analysis.hacks")
    assert sorted(m for m in loaded if m.startswith(unneeded)) == []


async def test_showing_a_rollout_loads_no_migrations_or_network(tmp_path: Path) -> None:
    url, rollout_id = await _one_rollout(tmp_path)

    loaded = _loaded("show", "--db", url, rollout_id)

    assert sorted(m for m in loaded if m.split(".")[0] in _HEAVY) == []
