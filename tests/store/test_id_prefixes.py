"""A unique prefix of a rollout, batch or call id stands for it, in the store's resolver and in
every command that takes one; an ambiguous prefix is one line that says how many it begins."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from click.testing import CliRunner

from rolltap.cli.main import cli
from rolltap.store import AmbiguousId, NewRollout, NotFound
from rolltap.store import open as open_store
from rolltap.store.events import Declared
from tests.cli.test_mistakes import one_line_error
from tests.support.cli import rolltap
from tests.support.records import call
from tests.support.stores import opened_store


def _populate(url: str) -> tuple[list[str], str]:
    """Three rollouts (batches b-one, b-two, none), the first with a call; ids and the call's."""

    async def run() -> tuple[list[str], str]:
        async with opened_store(url) as store:
            ids = []
            for batch in ("b-one", "b-two", None):
                created = await store.create_rollout(NewRollout(batch_id=batch, task_id="t"))
                ids.append(created.id)
            receipt = await store.append_call(call(ids[0], [1, 2, 3], [4, 5]))
            await store.report(ids[0], Declared("finished"), reward=1.0)
            return ids, receipt.call_id

    return asyncio.run(run())


def _unique_prefix(one: str, others: list[str]) -> str:
    n = next(n for n in range(1, 27) if not any(o.startswith(one[:n]) for o in others))
    return one[:n]


def test_the_resolver_takes_exact_ids_and_unique_prefixes(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    ids, call_id = _populate(url)
    with open_store(url, read_only=True) as store:
        for rid in ids:
            prefix = _unique_prefix(rid, [i for i in ids if i != rid])
            assert store.resolve("rollout", rid) == rid
            assert store.resolve("rollout", prefix) == rid
            assert store.resolve("rollout", prefix.lower()) == rid
        assert store.resolve("call", call_id[:-3]) == call_id
        assert store.resolve("batch", "b-o") == "b-one"
        assert store.resolve("batch", "b-two") == "b-two"
        with pytest.raises(AmbiguousId) as ambiguous:
            store.resolve("rollout", "0")
        assert str(ambiguous.value) == (
            f"'0' begins 3 rollout ids ({', '.join(sorted(ids))}): give more of the rollout id"
        )
        with pytest.raises(AmbiguousId, match=r"^'b-' begins 2 batch ids \(b-one, b-two\)"):
            store.resolve("batch", "b-")
        with pytest.raises(NotFound, match="no rollout 'ZZ'"):
            store.resolve("rollout", "ZZ")
        with pytest.raises(NotFound, match="no batch 'B-ONE'"):
            store.resolve("batch", "B-ONE")  # batch names are names: no case folding
        with pytest.raises(NotFound):
            store.resolve("rollout", "")


def test_every_command_that_takes_an_id_takes_a_prefix(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    ids, _ = _populate(url)
    first = _unique_prefix(ids[0], ids[1:])
    runner = CliRunner()

    def ok(*args: str) -> str:
        result = runner.invoke(cli, [*args, "--db", url])
        assert result.exit_code == 0, result.output
        return result.output

    assert f"rollout {ids[0]}" in ok("show", first)
    assert f'"id": "{ids[0]}"' in ok("show", first.lower(), "--json")
    listed = ok("ls", "--batch", "b-o").splitlines()
    assert [line.split()[0] for line in listed[1:]] == [ids[0]]
    assert f"rollout {ids[0]}  finished" in ok("audit", "verify", first)
    assert f"rollout {ids[1]}" in ok("audit", "verify", "--batch", "b-t")
    out = tmp_path / "one.jsonl"
    assert "from 1 rollouts" in ok("export", "--rollout", first, "--out", str(out))
    assert "from 1 rollouts" in ok("export", "--batch", "b-o", "--out", str(out))

    # An ambiguous prefix is one line, wherever it goes; a batch name no batch begins is
    # still "nothing matches".
    for args in (["show", "0"], ["audit", "verify", "0"], ["export", "--rollout", "0"]):
        line = one_line_error(rolltap(tmp_path, *args, "--db", url))
        assert line.startswith("Error: '0' begins 3 rollout ids (")
        assert line.endswith("): give more of the rollout id")
    line = one_line_error(rolltap(tmp_path, "ls", "--batch", "b", "--db", url))
    assert line == "Error: 'b' begins 2 batch ids (b-one, b-two): give more of the batch id"
    missing = rolltap(tmp_path, "ls", "--batch", "nothing", "--db", url)
    assert (missing.returncode, missing.stderr) == (0, "no rollouts match --batch nothing\n")
    assert one_line_error(rolltap(tmp_path, "show", "ZZZ", "--db", url)) == (
        "Error: no rollout 'ZZZ'"
    )


def test_replay_takes_a_prefix(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    ids, _ = _populate(url)
    prefix = _unique_prefix(ids[2], ids[:2])
    # Made by hand, the rollout has no run record to replay: the error names it by its full id.
    result = rolltap(tmp_path, "replay", prefix, "--db", url)
    assert result.returncode == 2, result.stderr
    assert ids[2] in result.stderr
    ambiguous = rolltap(tmp_path, "replay", "0", "--db", url)
    assert ambiguous.returncode == 2
    assert "'0' begins 3 rollout ids" in ambiguous.stderr
