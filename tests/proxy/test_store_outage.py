"""The database goes away under load: no sampled call is lost, new calls are refused at intake.

A private PostgreSQL server (never the shared one) is stopped for 10 s under 16 concurrent
clients, then started again; a SQLite store is locked by another connection. Every call the
engine served must end with its record and a complete answer; the only errors a client may see
are 503s at intake (with Retry-After), which never reach the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from rolltap.proxy.server import RunningProxy
from rolltap.store import CallStatus, Store
from tests.support.fake_vllm import FakeVLLM
from tests.support.private_postgres import private_postgres, private_postgres_unavailable_reason
from tests.support.proxy import fake_engine, new_rollout, running_proxy
from tests.support.stores import opened_store

CLIENTS = 16
CAPACITY = 8
MESSAGES = [{"role": "user", "content": "say ok"}]


@dataclass
class Load:
    """Closed-loop clients, each on its own rollout, half of them streaming."""

    proxy: RunningProxy
    keys: list[str]
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    answered: int = 0
    refused: int = 0
    """503s at intake (store busy), each with Retry-After."""
    other: Counter[int] = field(default_factory=Counter)
    """Any other non-200 status: must stay empty."""
    incomplete: int = 0
    """200 streams that ended without [DONE]: must stay 0."""

    async def client(self, i: int) -> None:
        url = f"{self.proxy.url}/r/{self.keys[i]}/v1/chat/completions"
        stream = i % 2 == 1
        body = orjson.dumps({"model": "m", "messages": MESSAGES, "stream": stream})
        timeout = aiohttp.ClientTimeout(total=120)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while not self.stop.is_set():
                async with session.post(url, data=body) as resp:
                    raw = await resp.read()
                    if resp.status == 200:
                        self.answered += 1
                        if stream and not raw.rstrip().endswith(b"data: [DONE]"):
                            self.incomplete += 1
                    elif resp.status == 503 and resp.headers.get("Retry-After"):
                        assert orjson.loads(raw)["error"]["code"] in (
                            "store_unavailable",
                            "store_backlog",
                        )
                        self.refused += 1
                        await asyncio.sleep(0.05)  # the test's clients retry sooner than asked
                    else:
                        self.other[resp.status] += 1

    async def until(self, check: Callable[[], Awaitable[bool]], within: float) -> float:
        started = time.monotonic()
        while not await check():
            assert time.monotonic() - started < within, "condition not reached in time"
            await asyncio.sleep(0.05)
        return time.monotonic() - started


async def _health(proxy: RunningProxy) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session, session.get(f"{proxy.url}/health") as resp:
        data: dict[str, Any] = await resp.json()
        return data


async def _probe(proxy: RunningProxy, key: str) -> tuple[int, str | None, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{proxy.url}/r/{key}/v1/chat/completions",
            data=orjson.dumps({"model": "m", "messages": MESSAGES}),
        ) as resp,
    ):
        return resp.status, resp.headers.get("Retry-After"), orjson.loads(await resp.read())


async def _outage(
    store: Store,
    fake: FakeVLLM,
    proxy: RunningProxy,
    go_away: Callable[[], Awaitable[None]],
    come_back: Callable[[], Awaitable[None]],
    seconds: float,
    degraded_as: str,
) -> Load:
    """Run the load, take the store away for `seconds`, bring it back; check the invariants."""
    rollouts = [await new_rollout(store) for _ in range(CLIENTS)]
    _, probe_key = await new_rollout(store)
    load = Load(proxy, [key for _, key in rollouts])
    clients = [asyncio.create_task(load.client(i)) for i in range(CLIENTS)]
    try:

        async def warmed() -> bool:
            return load.answered >= 3 * CLIENTS

        await load.until(warmed, within=30)
        await go_away()
        gone = time.monotonic()

        async def degraded() -> bool:
            health = await _health(proxy)
            return health["status"] == "degraded" and health["store"] == degraded_as

        await load.until(degraded, within=seconds)

        # The queue fills with the records of the calls in flight; then intake refuses.
        async def full() -> bool:
            return not store.accepting()

        await load.until(full, within=seconds)
        served = fake.served
        status, retry_after, error = await _probe(proxy, probe_key)
        assert (status, error["error"]["type"]) == (503, "service_unavailable")
        assert retry_after is not None
        assert int(retry_after) >= 1
        assert fake.served == served, "a refused call reached the engine"
        queued = store.status().queued
        assert queued <= CAPACITY + CLIENTS

        await asyncio.sleep(max(0.0, seconds - (time.monotonic() - gone)))
        await come_back()

        async def ok() -> bool:
            return (await _health(proxy))["status"] == "ok"

        recovery = await load.until(ok, within=60)
        answered_then = load.answered

        async def flowing() -> bool:
            return load.answered >= answered_then + 2 * CLIENTS

        await load.until(flowing, within=30)
    finally:
        load.stop.set()
        await asyncio.gather(*clients)

    recorded = Counter[CallStatus]()
    for rollout_id, _ in rollouts:
        recorded.update(c.status for c in await store.calls(rollout_id))
    # The refused probe left no record: recording it would have needed the full queue.
    probe_calls = await store.calls((await store.rollout_by_key(probe_key)).id)  # type: ignore[union-attr]
    print(
        f"\n{degraded_as}: {load.answered} calls answered, {load.refused} refused with 503 at "
        f"intake, {fake.served} served by the engine, {recorded[CallStatus.OK]} ok records, "
        f"{queued} writes queued at the probe (capacity {CAPACITY}), healthy again "
        f"{recovery:.1f} s after the store came back"
    )
    assert load.other == Counter(), "a client got an error other than a 503 at intake"
    assert load.incomplete == 0
    assert set(recorded) == {CallStatus.OK}
    assert recorded[CallStatus.OK] == fake.served == load.answered
    assert probe_calls == []
    return load


@pytest.mark.slow
async def test_postgres_stopped_for_10_s_under_16_clients_loses_nothing() -> None:
    reason = private_postgres_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    with private_postgres() as pg:
        async with opened_store(pg.url, capacity=CAPACITY, outage_limit=120) as store:
            fake = FakeVLLM(token_delay=0.001, record_requests=False)
            async with fake_engine(fake) as engine, running_proxy(store, engine.url) as proxy:
                await _outage(
                    store,
                    fake,
                    proxy,
                    lambda: asyncio.to_thread(pg.stop),
                    lambda: asyncio.to_thread(pg.start),
                    seconds=10,
                    degraded_as="down",
                )


async def test_locked_sqlite_database_loses_nothing(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite"
    store = await Store.connect(f"sqlite:///{path}", capacity=CAPACITY, slow_after=0.5)
    locker = sqlite3.connect(path, isolation_level=None, check_same_thread=False)

    async def lock() -> None:
        # Another process's write transaction: the writer's BEGIN IMMEDIATE waits behind it.
        locker.execute("BEGIN EXCLUSIVE")

    async def unlock() -> None:
        locker.execute("ROLLBACK")

    try:
        fake = FakeVLLM(token_delay=0.001, record_requests=False)
        async with fake_engine(fake) as engine, running_proxy(store, engine.url) as proxy:
            await _outage(store, fake, proxy, lock, unlock, seconds=3, degraded_as="slow")
    finally:
        with contextlib.suppress(sqlite3.Error):
            locker.close()
        await store.close()
