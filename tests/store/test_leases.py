"""Batch leases on SQLite and PostgreSQL: one holder at a time, however many processes race for
a batch, a gone holder taken over exactly once, and the run's lease held, refused, waited for
and lost as `rolltap run` uses it (runner/lease.py)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest

from rolltap.runner.lease import BatchBusy, LeaseLost, batch_lease, is_gone, process_start
from rolltap.store import Store
from rolltap.store.leases import Holder, Lease
from tests.support.stores import opened_store


def _holder(name: str, pid: int = 1) -> Holder:
    return Holder(token=f"tok-{name}", host="elsewhere", pid=pid, process_start="7")


def _never(_: Lease) -> bool:
    return False


def _always(_: Lease) -> bool:
    return True


async def test_a_held_batch_is_refused_until_its_holder_is_gone(store: Store) -> None:
    a, b = _holder("a"), _holder("b")
    first = await store.take_lease("b1", a, _never)
    assert first.won
    assert first.replaced is None
    assert (await store.take_lease("b1", a, _never)).won, "the holder's retry takes it again"
    refused = await store.take_lease("b1", b, _never)
    assert not refused.won
    assert refused.lease.holder == a

    taken = await store.take_lease("b1", b, _always)
    assert taken.won
    assert taken.replaced == a
    assert not await store.beat_lease("b1", a.token), "the old holder learns it lost the lease"
    assert await store.beat_lease("b1", b.token)
    await store.release_lease("b1", a.token)  # not its own: nothing happens
    lease = await store.lease("b1")
    assert lease is not None
    assert lease.holder == b

    await store.release_lease("b1", b.token)
    assert await store.lease("b1") is None
    assert (await store.take_lease("b1", a, _never)).won, "a released batch is free"
    other = await store.take_lease("b2", b, _never)
    assert other.won, "another batch name is another lease"


async def test_a_heartbeat_moves_the_lease_forward(store: Store) -> None:
    a = _holder("a")
    await store.take_lease("b1", a, _never)
    before = await store.lease("b1")
    await asyncio.sleep(0.05)
    assert await store.beat_lease("b1", a.token)
    after = await store.lease("b1")
    assert before is not None
    assert after is not None
    assert after.heartbeat_at > before.heartbeat_at
    assert after.acquired_at == before.acquired_at


async def test_racing_takers_on_two_stores_get_one_winner(db_url: str) -> None:
    """Sixteen takers on two stores (two writers, two connection pools) race for a free batch,
    then sixteen more for the same batch once its holder is judged gone: each time exactly one
    wins, and every loser is told who holds it."""
    async with opened_store(db_url) as one, opened_store(db_url) as two:
        holders = [_holder(f"h{i}") for i in range(16)]
        stores = [one, two] * 8
        free = await asyncio.gather(
            *(s.take_lease("race", h, _never) for s, h in zip(stores, holders, strict=True))
        )
        winners = [t.lease.holder for t in free if t.won]
        assert len(winners) == 1
        assert all(t.lease.holder == winners[0] for t in free)

        def first_is_gone(lease: Lease) -> bool:
            return lease.holder == winners[0]

        takers = [_holder(f"t{i}") for i in range(16)]
        over = await asyncio.gather(
            *(s.take_lease("race", h, first_is_gone) for s, h in zip(stores, takers, strict=True))
        )
        won = [t for t in over if t.won]
        assert len(won) == 1, "the gone holder was taken over exactly once"
        assert won[0].replaced == winners[0]
        assert all(t.lease.holder == won[0].lease.holder for t in over)
        final = await one.lease("race")
        assert final is not None
        assert final.holder == won[0].lease.holder


def _lease(holder: Holder, beat_ago: float) -> Lease:
    now = datetime.now(UTC)
    return Lease("b", holder, now - timedelta(seconds=beat_ago), now - timedelta(seconds=beat_ago))


def test_a_holder_is_gone_when_its_process_is() -> None:
    import socket

    here = socket.gethostname()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        alive = Holder("t", here, child.pid, process_start(child.pid))
        now = datetime.now(UTC)
        assert not is_gone(_lease(alive, 1), now=now)
        assert is_gone(_lease(alive, 61), now=now), "a stale heartbeat is gone wherever it runs"
        reused = Holder("t", here, child.pid, str(int(alive.process_start) + 1))
        assert is_gone(_lease(reused, 1), now=now), "the pid is another process now"
    finally:
        child.kill()
        child.wait()
    assert is_gone(_lease(alive, 1), now=datetime.now(UTC)), "its pid is dead"
    assert not is_gone(_lease(Holder("t", "elsewhere", child.pid, "1"), 1), now=datetime.now(UTC))
    me = Holder("t", here, os.getpid(), process_start(os.getpid()))
    assert not is_gone(_lease(me, 1), now=datetime.now(UTC))


async def test_a_run_holds_refuses_waits_and_releases(store: Store) -> None:
    said: list[str] = []
    async with batch_lease(store, "b1", heartbeat=0.05) as held:
        with pytest.raises(
            BatchBusy, match=r"batch b1 is being run by pid \d+ on .*: wait for it \(--wait\)"
        ):
            async with batch_lease(store, "b1"):
                pass
        lease = await store.lease("b1")
        assert lease is not None
        assert lease.holder.token == held.token
        assert held.leftovers == ()

        async def second() -> str:
            async with batch_lease(store, "b1", wait=True, say=said.append) as then:
                return then.token

        waiting = asyncio.ensure_future(second())
        await asyncio.sleep(0.3)
        assert not waiting.done(), "the waiting run waits while the first holds the batch"
    token = await asyncio.wait_for(waiting, 10)
    assert token != held.token
    assert said
    assert said[0].startswith("waiting: batch b1 is being run by pid")
    assert await store.lease("b1") is None, "each run released its lease at its end"


async def test_a_run_whose_lease_is_taken_over_stops(store: Store) -> None:
    with pytest.raises(LeaseLost, match="another run took it over"):
        async with batch_lease(store, "b1", heartbeat=0.05) as held:
            taken = await store.take_lease("b1", _holder("next"), _always)
            assert taken.won
            assert taken.replaced is not None
            assert taken.replaced.token == held.token
            await asyncio.sleep(5)  # cancelled at the next heartbeat
    lease = await store.lease("b1")
    assert lease is not None
    assert lease.holder.token == "tok-next", "the new holder keeps it"


async def test_a_gone_runs_sandboxes_are_named_for_the_next(store: Store) -> None:
    gone = Holder("tok-gone", "elsewhere", 1, "1")
    await store.take_lease("b1", gone, _never)
    said: list[str] = []
    async with batch_lease(store, "b1", say=said.append, stale_after=0.0) as held:
        assert held.leftovers == ("b1.tok-gone",)
        assert held.sandbox_run_id == f"b1.{held.token}"
    assert said == ["batch b1: its last run (pid 1 on elsewhere) is gone"]
