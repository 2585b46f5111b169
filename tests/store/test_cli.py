"""`rolltap ls` and `rolltap show` on a real store."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from click.testing import CliRunner

from rolltap.cli.main import cli
from rolltap.store import NewRollout
from rolltap.store.events import Declared
from tests.support.records import call
from tests.support.stores import opened_store


def _populate(url: str) -> tuple[str, str]:
    async def run() -> tuple[str, str]:
        async with opened_store(url) as store:
            old = await store.create_rollout(NewRollout(batch_id="b", task_id="old-task"))
            new = await store.create_rollout(NewRollout(batch_id="b", task_id="new-task"))
            await store.append_call(call(new.id, [1, 2, 3], [4, 5, 6, 7], purpose="title"))
            await store.append_call(call(new.id, [1, 2, 3, 4, 5, 6, 7, 8], [9]))
            await store.report(new.id, Declared("finished"), reward=1.0)
        return old.id, new.id

    return asyncio.run(run())


def test_ls_lists_newest_first_with_counts(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.sqlite"
    old, new = _populate(url)

    result = CliRunner().invoke(cli, ["ls", "--db", url])

    assert result.exit_code == 0, result.output
    lines = [line.split() for line in result.output.splitlines()[1:]]
    assert [line[0] for line in lines] == [new, old]
    assert lines[0][3:8] == ["finished", "1", "passed", "2", "16"]
    assert lines[1][3:8] == ["pending", "-", "unverified", "0", "0"]


def test_show_prints_one_line_per_call(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.sqlite"
    _, new = _populate(url)

    result = CliRunner().invoke(cli, ["show", new], env={"ROLLTAP_DB": url})

    assert result.exit_code == 0, result.output
    assert f"rollout {new}" in result.output
    rows = [line.split() for line in result.output.splitlines() if line.strip()[:1].isdigit()]
    assert [(r[0], r[4], r[5]) for r in rows] == [("1", "3", "4"), ("2", "8", "1")]
    assert "title" in result.output


def test_show_unknown_rollout(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.sqlite"
    _populate(url)
    result = CliRunner().invoke(cli, ["show", "nope", "--db", url])
    assert result.exit_code == 1
    assert "no rollout 'nope'" in result.output


def test_ls_batches_lists_each_batch_with_its_outcome(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.sqlite"
    assert CliRunner().invoke(cli, ["db", "upgrade", "--db", url]).exit_code == 0
    empty = CliRunner().invoke(cli, ["ls", "--batches", "--db", url])
    assert (empty.exit_code, empty.output) == (0, "no batches yet (`rolltap run` makes one)\n")
    _populate(url)

    result = CliRunner().invoke(cli, ["ls", "--batches", "--db", url])
    as_json = CliRunner().invoke(cli, ["ls", "--batches", "--json", "--db", url])
    mixed = CliRunner().invoke(cli, ["ls", "--batches", "--batch", "b", "--db", url])

    assert result.exit_code == 0, result.output
    header, row = result.output.splitlines()
    assert header.split()[:4] == ["batch", "started", "rollouts", "tasks"]
    cells = row.split()
    assert (cells[0], cells[3:8]) == ("b", ["2", "2", "1", "1/1", "finished"])
    (line,) = as_json.output.splitlines()
    shown = json.loads(line)
    assert shown["batch_id"] == "b"
    assert shown["statuses"] == {"pending": 1, "finished": 1}
    assert shown["created_at"].endswith("+00:00")
    assert mixed.exit_code == 1
    assert "--batches lists every batch" in mixed.output
