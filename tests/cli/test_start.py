"""What `rolltap ls`, `rolltap show` and `rolltap run --help` load: rows from a store whose
schema is current, and neither alembic nor the network and export libraries; `ls` not even
SQLAlchemy or numpy on a SQLite store, `run --help` not the runner (bench/cli_bench.py times
them)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from rolltap.cli.main import cli
from rolltap.store import CallStatus, NewRollout, Store
from rolltap.store.events import Declared
from tests.support.records import call
from tests.support.stores import opened_store

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
_SQL_AND_ARRAYS = ("sqlalchemy", "aiosqlite", "numpy", "rolltap.store.models")


def _loaded(*argv: str) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, *argv], check=True, capture_output=True, text=True
    )
    return set(json.loads(done.stderr.splitlines()[-1]))


async def _one_rollout(tmp_path: Path) -> tuple[str, str]:
    url = f"sqlite:///{tmp_path}/cli.sqlite"
    store = await Store.connect(url)
    created = await store.create_rollout(NewRollout(batch_id="b", task_id="t"))
    await store.report(created.id, Declared("finished"), reward=1.0)
    await store.close()
    return url, created.id


async def test_listing_rollouts_loads_no_migrations_analysis_or_audit(tmp_path: Path) -> None:
    url, _ = await _one_rollout(tmp_path)

    loaded = _loaded("ls", "--db", url)

    unneeded = (*_HEAVY, "rolltap.audit", "rolltap.analysis.trajectory", "rolltap.analysis.hacks")
    assert sorted(m for m in loaded if m.startswith(unneeded)) == []


async def test_listing_a_sqlite_store_loads_neither_sqlalchemy_nor_numpy(tmp_path: Path) -> None:
    url, _ = await _one_rollout(tmp_path)

    loaded = _loaded("ls", "--db", url) | _loaded("ls", "--batches", "--db", url)

    assert sorted(m for m in loaded if m.startswith(_SQL_AND_ARRAYS)) == []


def test_run_help_loads_no_runner_store_or_sandbox_sdk() -> None:
    loaded = _loaded("run", "--help") | _loaded("demo", "--help")

    unneeded = (*_HEAVY, *_SQL_AND_ARRAYS, "rolltap.runner.batch", "rolltap.proxy.app", "docker")
    assert sorted(m for m in loaded if m.startswith(unneeded)) == []


def test_listing_reads_what_the_store_reads_on_either_database(db_url: str) -> None:
    async def populate() -> list[dict[str, object]]:
        async with opened_store(db_url) as store:
            plain = await store.create_rollout(NewRollout(batch_id="b", task_id="t"))
            full = await store.create_rollout(
                NewRollout(batch_id="b", task_id="t", sample_index=1, harness="h", meta={"k": 1})
            )
            await store.report(full.id, Declared("running"))
            await store.append_call(call(full.id, [1, 2, 3], [4, 5]))
            await store.append_call(call(full.id, [], status=CallStatus.REJECTED))
            await store.report(
                full.id, Declared("finished"), reward=0.5, reward_details={"ending": "finished"}
            )
            return [(await store.rollout(r.id)).as_dict() for r in (full, plain)]

    expected = asyncio.run(populate())

    listed = CliRunner().invoke(cli, ["ls", "--json", "--db", db_url])
    batches = CliRunner().invoke(cli, ["ls", "--batches", "--json", "--db", db_url])

    assert listed.exit_code == 0, listed.output
    assert [json.loads(line) for line in listed.output.splitlines()] == expected
    batch = json.loads(batches.output)
    assert (batch["rollouts"], batch["rewarded"], batch["mean_reward"]) == (2, 1, 0.5)
    assert batch["statuses"] == {"finished": 1, "pending": 1}
    assert batch["created_at"] == expected[1]["created_at"]


async def test_showing_a_rollout_loads_no_migrations_or_network(tmp_path: Path) -> None:
    url, rollout_id = await _one_rollout(tmp_path)

    loaded = _loaded("show", "--db", url, rollout_id)

    assert sorted(m for m in loaded if m.split(".")[0] in _HEAVY) == []
