"""Two proxies on one PostgreSQL store act as one: any key on either, one backend per rollout
from both, sequence numbers that never collide, and pause/resume, weight updates and the
backend set that hold on both."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import aiohttp
import asyncpg
import pytest

from rolltap.audit.integrity import verify_rollout
from rolltap.proxy.server import RunningProxy
from rolltap.proxy.upstream.engines import EngineKind
from rolltap.store import Store
from tests.support.databases import PostgresServer
from tests.support.fake_vllm import FakeVLLM, Reply
from tests.support.proxy import Engine, OpenAIFactory, fake_engine, running_proxy
from tests.support.stores import opened_store
from tests.support.waiting import until

pytestmark = pytest.mark.postgres

MESSAGES = [{"role": "user", "content": "hello"}]


@dataclass
class Replicas:
    store: Store
    a: RunningProxy
    b: RunningProxy
    engines: list[Engine]


@pytest.fixture
def pg_url(postgres: PostgresServer) -> Iterator[str]:
    name = postgres.fresh()
    try:
        yield postgres.url(name)
    finally:
        postgres.drop(name)


@pytest.fixture
async def replicas(pg_url: str) -> AsyncIterator[Replicas]:
    """Two proxies, each with its own store (writer, pool, listener) on one database, in front
    of the same two engines."""
    async with AsyncExitStack() as stack:
        engines = [
            await stack.enter_async_context(
                fake_engine(FakeVLLM(script=lambda body: Reply(text="ok", token_delay=0.005)))
            )
            for _ in range(2)
        ]
        urls = [e.url for e in engines]
        proxies = []
        stores = []
        for _ in range(2):
            store = await stack.enter_async_context(opened_store(pg_url))
            stores.append(store)
            proxies.append(await stack.enter_async_context(running_proxy(store, *urls)))
        yield Replicas(stores[0], proxies[0], proxies[1], engines)


async def _post(url: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session, session.post(url, json=body or {}) as resp:
        assert resp.status in (200, 201), await resp.text()
        data: dict[str, Any] = await resp.json()
        return data


async def test_a_rollout_on_both_replicas_keeps_one_backend_and_one_sequence(
    replicas: Replicas, sdk: OpenAIFactory
) -> None:
    rollouts = [await replicas.store.create_rollout() for _ in range(8)]

    async def conversation(key: str) -> None:
        # The first call goes to one replica; then each turn sends a call to each replica at
        # once (sub-agents), whichever the harness's connections reach.
        a, b = (sdk(f"{p.url}/r/{key}/v1") for p in (replicas.a, replicas.b))
        await a.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
        for _ in range(2):
            await asyncio.gather(
                *(
                    client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
                    for client in (a, b)
                )
            )

    await asyncio.gather(*(conversation(r.key) for r in rollouts))
    used: set[str] = set()
    for created in rollouts:
        calls = await replicas.store.calls(created.id)
        assert sorted(c.seq for c in calls) == list(range(1, 6))
        backends = {c.backend for c in calls}
        assert len(backends) == 1, f"{created.id}: calls went to {backends}"
        used |= {b for b in backends if b}
        assert (await verify_rollout(replicas.store, created.id)).ok
    # Both engines served rollouts: the agreement is the ring's, not one backend taking all.
    assert used == {e.url for e in replicas.engines}


async def test_pause_on_one_replica_holds_the_other_until_resume_with_a_version(
    replicas: Replicas, sdk: OpenAIFactory
) -> None:
    created = await replicas.store.create_rollout()
    paused = await _post(f"{replicas.a.url}/admin/pause?wait=5")
    assert (paused["paused"], paused["drained"]) == (True, True)
    assert paused["replicas"] == {"others": 1, "held": 1, "missing": []}
    assert replicas.b.ctx.hold.paused
    held = asyncio.ensure_future(
        sdk(f"{replicas.b.url}/r/{created.key}/v1").chat.completions.create(
            model="m",
            messages=MESSAGES,  # type: ignore[arg-type]
        )
    )
    await until(lambda: replicas.b.ctx.hold.waiting == 1)
    await asyncio.sleep(0.1)
    assert not held.done()

    await _post(f"{replicas.b.url}/admin/resume", {"weight_version": "7"})
    await held
    await until(lambda: not replicas.a.ctx.hold.paused)
    assert replicas.a.ctx.hold.weight_version == "7"
    reply = await sdk(f"{replicas.a.url}/r/{created.key}/v1").chat.completions.create(
        model="m",
        messages=MESSAGES,  # type: ignore[arg-type]
    )
    assert reply.choices[0].message.content
    calls = await replicas.store.calls(created.id)
    assert [c.weight_version for c in calls] == ["7", "7"]


async def test_weight_update_drains_every_replica_and_commits_everywhere(
    replicas: Replicas, sdk: OpenAIFactory
) -> None:
    slow = FakeVLLM(script=lambda body: Reply(text="a slow answer here", token_delay=0.05))
    async with fake_engine(slow) as engine:
        for proxy in (replicas.a, replicas.b):
            proxy.ctx.pool.remove(replicas.engines[0].url)
            proxy.ctx.pool.remove(replicas.engines[1].url)
            proxy.ctx.pool.add(engine.url, EngineKind.VLLM)
        created = await replicas.store.create_rollout()
        inflight = asyncio.ensure_future(
            sdk(f"{replicas.b.url}/r/{created.key}/v1").chat.completions.create(
                model="m",
                messages=MESSAGES,  # type: ignore[arg-type]
            )
        )
        await until(lambda: replicas.b.ctx.hold.inflight == 1)
        began = await _post(f"{replicas.a.url}/v1/weights/begin", {"mode": "drain", "timeout": 10})
        # A's answer waited for B's call: drained speaks for every replica.
        assert began["drained"] is True
        assert inflight.done()
        assert replicas.b.ctx.hold.update is not None

        committed = await _post(f"{replicas.a.url}/v1/weights/commit", {"version": "v2"})
        assert committed["weight_version"] == "v2"
        await until(lambda: replicas.b.ctx.hold.weight_version == "v2")
        assert replicas.b.ctx.hold.epoch_of("v2") == replicas.a.ctx.hold.epoch_of("v2") == 1
        assert not replicas.b.ctx.hold.paused


async def test_a_backend_added_on_one_replica_serves_from_both(replicas: Replicas) -> None:
    async with fake_engine() as extra:
        await _post(f"{replicas.a.url}/admin/backends", {"url": extra.url})
        await until(lambda: replicas.b.ctx.pool.get(extra.url) is not None)
        async with aiohttp.ClientSession() as session:
            async with session.delete(
                f"{replicas.b.url}/admin/backends", params={"url": extra.url}
            ) as resp:
                assert resp.status == 200
        await until(lambda: replicas.a.ctx.pool.get(extra.url) is None)


async def test_a_replica_that_starts_later_takes_over_the_gate(
    replicas: Replicas, pg_url: str
) -> None:
    await _post(f"{replicas.a.url}/admin/resume", {"weight_version": "3"})
    await _post(f"{replicas.a.url}/admin/pause")
    async with opened_store(pg_url) as store:
        async with running_proxy(store, *(e.url for e in replicas.engines)) as late:
            assert late.ctx.hold.paused
            assert late.ctx.hold.weight_version == "3"
            assert late.ctx.hold.epoch_of("3") == 1


async def test_a_replica_whose_listener_is_dropped_listens_again(
    replicas: Replicas, pg_url: str
) -> None:
    b = replicas.b.ctx.bus.replica_id
    conn = await asyncpg.connect(pg_url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        dropped = await conn.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = $1",
            f"rolltap-proxy {b}",
        )
    finally:
        await conn.close()
    assert dropped == 1
    for _ in range(100):
        if b in await replicas.a.ctx.bus.peers():
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("the dropped replica never listened again")
    paused = await _post(f"{replicas.a.url}/admin/pause")
    assert paused["replicas"] == {"others": 1, "held": 1, "missing": []}
    assert replicas.b.ctx.hold.paused
