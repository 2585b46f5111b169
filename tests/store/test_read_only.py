"""A store opened read-only (what `rolltap ui` uses), and the readers the viewer lists with."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import typing
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from rolltap.analysis.reading import analyze_rollout, rollout_trajectories
from rolltap.store import (
    DatabaseUnavailable,
    NewRollout,
    ReadOnly,
    Store,
)
from rolltap.store.events import Declared
from rolltap.store.filters import FilterKeywords, RolloutFilter
from rolltap.store.migrate import SchemaOutOfDate, head_revision
from rolltap.store.queries import DRIFT_FILTERS
from rolltap.store.reader import open as open_reader
from tests.support.records import call
from tests.support.stores import opened_store

INITIAL = "ceb17e07993d"
"""The first migration: a store left at it predates every later table."""


async def _fill(store: Store) -> dict[str, str]:
    """Three finished rollouts of batch b (one analysed with a break), one of batch c."""
    ids = {}
    for name, task, harness in [
        ("broken", "t1", "codex"),
        ("clean", "t1", "codex"),
        ("half", "t2", "claude-code"),
    ]:
        created = await store.create_rollout(
            NewRollout(batch_id="b", task_id=task, sample_index=len(ids), harness=harness)
        )
        ids[name] = created.id
    await store.append_call(call(ids["broken"], [1, 2, 3], [4, 5]))
    # The harness sends the answer back changed: a break.
    await store.append_call(call(ids["broken"], [1, 2, 3, 4, 9, 6], [7]))
    await store.append_call(call(ids["clean"], [1, 2], [3]))
    await store.append_call(call(ids["clean"], [1, 2, 3, 8], [9]))
    for name, reward in [("broken", 1.0), ("clean", 0.0), ("half", 0.5)]:
        await store.report(ids[name], Declared("finished"), reward=reward)
    await analyze_rollout(store, ids["broken"])
    await analyze_rollout(store, ids["clean"])
    other = await store.create_rollout(NewRollout(batch_id="c", task_id="t9"))
    ids["other"] = other.id
    return ids


async def test_read_only_store_reads_and_refuses_writes(db_url: str) -> None:
    async with opened_store(db_url) as writer:
        ids = await _fill(writer)

    async with opened_store(db_url, read_only=True) as store:
        assert (await store.rollout(ids["broken"])).n_calls == 2
        with pytest.raises(ReadOnly):
            await store.create_rollout(NewRollout())
        with pytest.raises(ReadOnly):
            await store.update_rollout(ids["half"], reward=0.0)
        with pytest.raises(ReadOnly):
            await analyze_rollout(store, ids["half"])
        # Even a statement past the store's API is refused by the database itself (SQLite's
        # refusal reads as an outage to the store: a read-only file is one for its writer).
        with pytest.raises((DBAPIError, DatabaseUnavailable), match=r"read.?only"):
            await store.db.read(lambda c: c.execute(text("DELETE FROM rollout")))
        assert len(await store.rollouts()) == 4
        # Trajectories are assembled on the store's read thread, opened read-only as well.
        built = await rollout_trajectories(store, ids["broken"])
        assert len(built.trajectories) == 2


def test_read_only_creates_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "store.sqlite"
    with pytest.raises(DatabaseUnavailable, match="no rolltap store at"):
        asyncio.run(Store.connect(f"sqlite:///{missing}", read_only=True))
    assert not missing.parent.exists()

    empty = tmp_path / "empty.sqlite"
    empty.touch()
    with pytest.raises(SchemaOutOfDate, match="holds no rolltap store"):
        asyncio.run(Store.connect(f"sqlite:///{empty}", read_only=True))
    assert empty.stat().st_size == 0


@pytest.mark.parametrize(
    ("revision", "says"),
    [(INITIAL, "run `rolltap db upgrade` first"), ("f00d", "upgrade rolltap")],
)
def test_read_only_never_migrates_a_stale_file(tmp_path: Path, revision: str, says: str) -> None:
    path = tmp_path / "old.sqlite"

    async def make_stale() -> None:
        async with opened_store(f"sqlite:///{path}") as store:
            async with store.db.writer.begin() as conn:
                await conn.execute(text(f"UPDATE alembic_version SET version_num = '{revision}'"))

    asyncio.run(make_stale())
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    with pytest.raises(SchemaOutOfDate, match=says):
        asyncio.run(Store.connect(f"sqlite:///{path}", read_only=True))
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    assert head_revision() != revision


async def test_rollout_filters(db_url: str) -> None:
    async with opened_store(db_url) as store:
        ids = await _fill(store)

        async def found(**filters: object) -> set[str]:
            return {r.id for r in await store.rollouts(**filters)}

        assert await found(batch="b", task="t1") == {ids["broken"], ids["clean"]}
        assert await found(harness="claude-code") == {ids["half"]}
        assert await found(min_reward=0.5) == {ids["broken"], ids["half"]}
        assert await found(min_reward=0.1, max_reward=0.9) == {ids["half"]}
        analyses = await store.analyses([ids["broken"], ids["clean"], ids["half"]])
        assert set(analyses) == {ids["broken"], ids["clean"]}
        assert analyses[ids["clean"]].share == 1.0
        (kind,) = analyses[ids["broken"]].breaks
        assert analyses[ids["broken"]].lost_tokens == 1

        assert await found(drift="any") == {ids["broken"]}
        assert await found(drift=kind) == {ids["broken"]}
        other = next(d for d in DRIFT_FILTERS[2:] if d != kind)
        assert await found(drift=other) == set()
        # "none": analysed and unbroken; never-analysed rollouts are not claimed clean.
        assert await found(drift="none") == {ids["clean"]}
        with pytest.raises(ValueError, match="unknown drift filter"):
            await store.rollouts(drift="weird")
        newest_first = await store.rollouts(batch="b")
        assert [r.id for r in await store.rollouts(batch="b", limit=2, offset=1)] == [
            r.id for r in newest_first[1:3]
        ]


async def test_one_rollout_filter_for_the_store_and_the_blocking_reader(db_url: str) -> None:
    async with opened_store(db_url) as store:
        ids = await _fill(store)
        await store.update_rollout(ids["clean"], hack_flags=[])
        where = RolloutFilter(batch="b", hack="unchecked")
        unchecked = {ids["broken"], ids["half"]}
        assert {r.id for r in await store.rollouts(where)} == unchecked
        assert {r.id for r in await store.rollouts(batch="b", hack="unchecked")} == unchecked
        assert {r.id for r in await store.rollouts(where, task="t1")} == {ids["broken"]}

    def read() -> tuple[set[str], set[str]]:
        with open_reader(db_url, read_only=True) as reader:
            return (
                {r.id for r in reader.rollouts(where)},
                {r.id for r in reader.rollouts(batch="b", hack="none")},
            )

    # The blocking reader takes the same filter, `hack` included.
    assert await asyncio.to_thread(read) == (unchecked, {ids["clean"]})
    with pytest.raises(TypeError, match="colour"):
        RolloutFilter.of(where, colour="red")


def test_the_keyword_form_types_every_field_as_the_filter_does() -> None:
    """The listings' keywords (FilterKeywords, for the type checker) are RolloutFilter's
    fields, each with the same type: a field added to one and not the other fails here."""
    fields = typing.get_type_hints(RolloutFilter)
    assert set(fields) == {f.name for f in dataclasses.fields(RolloutFilter)}
    assert typing.get_type_hints(FilterKeywords) == fields
    assert not FilterKeywords.__total__


async def test_batches_summarise_newest_first(db_url: str) -> None:
    async with opened_store(db_url) as store:
        await _fill(store)
        batches = await store.batches()
        assert [b.batch_id for b in batches] == ["c", "b"]
        c, b = batches
        assert (b.rollouts, b.tasks, b.statuses) == (3, 2, {"finished": 3})
        assert (b.rewarded, b.passed) == (3, 1)
        assert b.mean_reward == pytest.approx(0.5)
        assert b.finished_at is not None
        assert b.finished_at >= b.created_at
        assert (c.rollouts, c.rewarded, c.mean_reward, c.statuses) == (1, 0, None, {"pending": 1})
        assert [x.batch_id for x in await store.batches(limit=1, offset=1)] == ["b"]
        assert (await store.batches(pass_reward=0.5))[1].passed == 2
