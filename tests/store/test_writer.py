"""Group commit: many writes share a transaction, each caller still learns of its own durability."""

from __future__ import annotations

import asyncio
import sqlite3
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.dialects import sqlite

from rolltap.store import NewRollout, NotFound, Store, StoreReader
from rolltap.store.events import Declared
from rolltap.store.models import call_table
from tests.support.records import call
from tests.support.stores import opened_store


async def test_concurrent_appends_share_commits_and_are_durable_when_awaited(
    store: Store, db_url: str
) -> None:
    rollouts = [await store.create_rollout(NewRollout(task_id=f"t{i}")) for i in range(20)]
    commits_before = store.commits

    receipts = await asyncio.gather(
        *(store.append_call(call(r.id, [i, i + 1], [i + 2])) for i in range(25) for r in rollouts)
    )

    assert len({r.call_id for r in receipts}) == 500
    assert store.commits - commits_before < 100
    # Durable means visible to an independent connection (another process would see it too).
    async with opened_store(db_url) as other:
        counts = [len(await other.calls(r.id)) for r in rollouts]
    assert counts == [25] * 20


async def test_one_bad_write_fails_alone(store: Store) -> None:
    rollout = await store.create_rollout()
    good = [store.append_call(call(rollout.id, [1], [2])) for _ in range(5)]
    bad = store.report("no-such-rollout", Declared("failed"))
    orphan = store.append_call(call("no-such-rollout", [1], [2]))

    results = await asyncio.gather(*good, bad, orphan, return_exceptions=True)

    assert all(not isinstance(r, BaseException) for r in results[:5])
    assert isinstance(results[5], NotFound)
    assert isinstance(results[6], Exception)
    assert [c.seq for c in await store.calls(rollout.id)] == [1, 2, 3, 4, 5]


async def test_rollout_lifecycle_and_listing(store: Store) -> None:
    first = await store.create_rollout(NewRollout(batch_id="b1", task_id="a", sample_index=0))
    second = await store.create_rollout(NewRollout(batch_id="b1", task_id="a", sample_index=1))
    other = await store.create_rollout(NewRollout(batch_id="b2", task_id="z"))
    await store.report(first.id, Declared("running"))
    await store.report(
        first.id, Declared("finished"), reward=0.5, reward_details={"reward": 0.5, "tests": 3}
    )
    await store.append_call(call(first.id, [1, 2, 3], [4, 5]))

    listed = await store.rollouts(batch="b1")
    assert [r.id for r in listed] == [second.id, first.id]
    done = await store.rollout(first.id)
    assert (done.status.value, done.reward, done.n_calls, done.n_tokens) == ("finished", 0.5, 1, 5)
    assert done.reward_details == {"reward": 0.5, "tests": 3}
    assert done.started_at is not None
    assert done.finished_at is not None
    assert done.started_at <= done.finished_at
    assert [r.id for r in await store.rollouts(status="pending")] == [other.id, second.id]
    assert (await store.rollout_by_key(first.key)) == done
    assert await store.rollout_by_key("rk-not-a-key") is None


async def test_the_secret_key_is_stored_only_as_a_hash(store: Store) -> None:
    created = await store.create_rollout()
    async with store.db.connect() as conn:
        row = (await conn.execute(text("SELECT * FROM rollout"))).one()
    assert created.key not in [str(v) for v in row]


async def test_a_batch_never_holds_the_same_sample_twice(store: Store) -> None:
    await store.create_rollout(NewRollout(batch_id="b", task_id="t", sample_index=0))
    with pytest.raises(Exception, match=r"(?i)unique"):
        await store.create_rollout(NewRollout(batch_id="b", task_id="t", sample_index=0))


def test_sync_reader_works_inside_a_running_event_loop(db_url: str) -> None:
    async def write() -> str:
        async with opened_store(db_url) as store:
            rollout = await store.create_rollout(NewRollout(task_id="sync"))
            await store.append_call(call(rollout.id, [7, 8], [9]))
        return rollout.id

    rollout_id = asyncio.run(write())

    async def read_from_a_coroutine() -> list[int]:
        # A trainer's own loop is running here; the reader must not need it.
        with StoreReader(db_url) as reader:
            (tokens,) = reader.rollout_tokens(rollout_id).values()
            return tokens.prompt_ids.tolist()

    assert asyncio.run(read_from_a_coroutine()) == [7, 8]


async def test_sqlite_times_are_stored_as_core_writes_them(tmp_path: Path) -> None:
    """The writer formats a call's times itself on SQLite; the text must be Core's, or reads,
    ordering and comparisons against Core-bound times would go wrong."""
    url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    utc = datetime(2026, 3, 1, 23, 59, 58, 123456, tzinfo=UTC)
    whole = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    east = datetime(2026, 3, 2, 1, 30, 5, 7, tzinfo=timezone(timedelta(hours=2)))
    async with opened_store(url) as store:
        rollout = await store.create_rollout()
        record = call(rollout.id, [1, 2], [3], dispatched_at=whole, finished_at=east)
        record.received_at = utc
        await store.append_call(record)
        [view] = await store.calls(rollout.id)
    assert (view.received_at, view.dispatched_at, view.finished_at) == (utc, whole, east)
    core = call_table.c.received_at.type._cached_bind_processor(sqlite.dialect())
    with sqlite3.connect(tmp_path / "store.sqlite") as conn:
        stored = conn.execute(
            "SELECT received_at, dispatched_at, first_token_at, finished_at FROM call"
        ).fetchone()
    assert stored == (core(utc), core(whole), None, core(east))
