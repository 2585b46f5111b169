"""`rolltap export --out` into folders that do not exist yet, through the real command: it makes
them (issue #35: a new user's first export into `runs/today/` was refused), and a file standing
where a folder should be is still one line."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pyarrow.parquet as pq

from rolltap.store import NewRollout
from rolltap.store.events import Declared
from tests.cli.test_mistakes import one_line_error, tree
from tests.support.cli import rolltap
from tests.support.records import call
from tests.support.stores import opened_store


def _one_finished_rollout(url: str) -> str:
    async def made() -> str:
        async with opened_store(url) as store:
            rollout = await store.create_rollout(NewRollout(batch_id="b", task_id="t"))
            asked = {"messages": [{"role": "user", "content": "hi"}]}
            reply = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}]}
            await store.append_call(
                call(
                    rollout.id,
                    [1, 2, 3],
                    [4, 5],
                    request_body=json.dumps(asked).encode(),
                    response_body=json.dumps(reply).encode(),
                )
            )
            await store.report(rollout.id, Declared("finished"), reward=1.0)
            return rollout.id

    return asyncio.run(made())


def test_export_makes_the_missing_folders_of_out(tmp_path: Path) -> None:
    rollout_id = _one_finished_rollout(f"sqlite:///{tmp_path / 's.sqlite'}")

    done = rolltap(tmp_path, "export", "--db", "s.sqlite", "--out", "a/b/out.parquet")

    assert done.returncode == 0, done.stderr
    out = tmp_path / "a" / "b" / "out.parquet"
    assert "from 1 rollouts to a/b/out.parquet" in done.stdout
    rows = pq.read_table(out).to_pylist()
    assert [(r["rollout_id"], list(r["prompt_ids"]), r["reward"]) for r in rows] == [
        (rollout_id, [1, 2, 3], 1.0)
    ]


def test_export_under_a_file_is_one_line_and_makes_nothing(tmp_path: Path) -> None:
    _one_finished_rollout(f"sqlite:///{tmp_path / 's.sqlite'}")
    (tmp_path / "notes.txt").write_text("a file, not a folder\n")
    before = tree(tmp_path)

    refused = rolltap(tmp_path, "export", "--db", "s.sqlite", "--out", "notes.txt/b/out.parquet")

    assert one_line_error(refused) == (
        f"Error: --out notes.txt/b/out.parquet: {tmp_path / 'notes.txt'} is not a directory"
    )
    assert tree(tmp_path) == before
