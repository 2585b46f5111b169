"""Sticky routing over three real backends: stickiness, balance, failover, runtime changes."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator

import aiohttp
import openai
import orjson
import pytest

from rolltap.store import CallStatus, Store
from tests.support.fake_vllm import FakeVLLM
from tests.support.processes import free_port
from tests.support.proxy import Engine, OpenAIFactory, fake_engine, new_rollout, running_proxy
from tests.support.waiting import until

MESSAGES = [{"role": "user", "content": "hello"}]


@contextlib.asynccontextmanager
async def three_engines() -> AsyncIterator[list[Engine]]:
    async with fake_engine() as a, fake_engine() as b, fake_engine() as c:
        yield [a, b, c]


def _served_by(engines: list[Engine]) -> dict[str, int]:
    return {e.url: len(e.fake.requests) for e in engines}


async def test_each_rollout_sticks_to_one_backend_and_load_spreads(
    store: Store, sdk: OpenAIFactory
) -> None:
    async with three_engines() as engines, running_proxy(store, *(e.url for e in engines)) as proxy:
        rollouts = [await new_rollout(store) for _ in range(30)]
        for _ in range(3):
            await asyncio.gather(
                *(
                    sdk(f"{proxy.url}/r/{key}/v1").chat.completions.create(
                        model="m", messages=MESSAGES
                    )
                    for _, key in rollouts
                )
            )

        per_backend: Counter[str] = Counter()
        for rollout_id, _ in rollouts:
            backends = {c.backend for c in await store.calls(rollout_id)}
            assert len(backends) == 1, f"rollout {rollout_id} moved between {backends}"
            per_backend[backends.pop() or ""] += 1
        # 30 rollouts over 3 backends, none starved or hoarding (bounded loads).
        assert set(per_backend) == {e.url for e in engines}
        assert max(per_backend.values()) <= 18
        # The engine sees the rollout id as its session id, for its own logs and caches.
        for engine in engines:
            assert all(h["X-Session-ID"] for _, h, _ in engine.fake.requests)


async def test_failover_before_the_first_byte_and_re_stick(
    store: Store, sdk: OpenAIFactory
) -> None:
    async with three_engines() as engines, running_proxy(store, *(e.url for e in engines)) as proxy:
        rollout_id, key = await new_rollout(store)
        client = sdk(f"{proxy.url}/r/{key}/v1", max_retries=0)
        await client.chat.completions.create(model="m", messages=MESSAGES)
        (first,) = await store.calls(rollout_id)
        home = next(e for e in engines if e.url == first.backend)
        home_url = home.url

        await home.server.close()  # the sticky backend dies
        for stream in (False, True):
            reply = await client.chat.completions.create(
                model="m", messages=MESSAGES, stream=stream
            )
            if stream:
                async for _ in reply:  # type: ignore[union-attr]
                    pass

        calls = await store.calls(rollout_id)
        assert all(c.status is CallStatus.OK for c in calls)
        assert calls[1].backend != home_url
        # Re-stuck: every later call of the rollout goes to the same new backend.
        assert calls[1].backend == calls[2].backend


async def test_stream_that_breaks_before_its_first_event_fails_over(
    store: Store, sdk: OpenAIFactory
) -> None:
    from tests.support.fake_vllm import DieAfter, Reply

    broken = FakeVLLM(script=lambda body: Reply(fault=DieAfter(0)))
    async with (
        fake_engine(broken) as bad,
        fake_engine() as good,
        running_proxy(store, bad.url) as proxy,
    ):
        rollout_id, key = await new_rollout(store)
        proxy.ctx.pool.add(good.url, proxy.ctx.pool.all()[0].kind)
        proxy.ctx.router._assigned[rollout_id] = bad.url  # start on the bad one
        client = sdk(f"{proxy.url}/r/{key}/v1", max_retries=0)

        text = ""
        async for chunk in await client.chat.completions.create(
            model="m", messages=MESSAGES, stream=True
        ):
            text += chunk.choices[0].delta.content or ""

        assert text == "echo: hello"
        (call,) = await store.calls(rollout_id)
        assert call.backend == good.url
        assert len(bad.fake.requests) == 1


async def test_health_checks_take_backends_out_and_bring_them_back(store: Store) -> None:
    async with three_engines() as engines, running_proxy(store, *(e.url for e in engines)) as proxy:
        engines[0].fake.healthy = False
        await until(lambda: not proxy.ctx.pool.get(engines[0].url).healthy)  # type: ignore[union-attr]
        rollouts = [await new_rollout(store) for _ in range(12)]
        async with aiohttp.ClientSession() as session:
            for _, key in rollouts:
                async with session.post(
                    f"{proxy.url}/r/{key}/v1/chat/completions",
                    data=orjson.dumps({"messages": MESSAGES}),
                ) as resp:
                    assert resp.status == 200
        assert len(engines[0].fake.requests) == 0

        engines[0].fake.healthy = True
        await until(lambda: proxy.ctx.pool.get(engines[0].url).healthy)  # type: ignore[union-attr]
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{proxy.url}/admin/backends") as resp,
        ):
            listed = (await resp.json())["backends"]
        assert all(b["healthy"] for b in listed)


async def test_backends_added_and_removed_at_run_time(store: Store, sdk: OpenAIFactory) -> None:
    async with three_engines() as engines, running_proxy(store, engines[0].url) as proxy:
        async with aiohttp.ClientSession() as session:
            for engine in engines[1:]:
                async with session.post(
                    f"{proxy.url}/admin/backends", json={"url": engine.url + "/v1"}
                ) as resp:
                    assert resp.status == 201
                    assert (await resp.json())["url"] == engine.url
            # Rollouts land on backends by the hash of their random ids: add rollouts until
            # each backend has one, rather than hoping a fixed number spreads over all three.
            rollouts = []
            while not all(_served_by(engines).values()):
                assert len(rollouts) < 200, _served_by(engines)
                rollouts.append(await new_rollout(store))
                await sdk(f"{proxy.url}/r/{rollouts[-1][1]}/v1").chat.completions.create(
                    model="m", messages=MESSAGES
                )

            async with session.delete(
                f"{proxy.url}/admin/backends", params={"url": engines[0].url}
            ) as resp:
                assert resp.status == 200
            before = len(engines[0].fake.requests)
            for _, key in rollouts:
                await sdk(f"{proxy.url}/r/{key}/v1").chat.completions.create(
                    model="m", messages=MESSAGES
                )
            assert len(engines[0].fake.requests) == before


async def test_a_backend_down_at_start_is_never_shown_healthy(store: Store) -> None:
    async with fake_engine() as up:
        down = f"http://127.0.0.1:{free_port()}"
        async with running_proxy(store, up.url, down) as proxy, aiohttp.ClientSession() as s:
            async with s.get(f"{proxy.url}/health") as resp:
                assert (resp.status, (await resp.json())["healthy_backends"]) == (200, 1)
            async with s.get(f"{proxy.url}/admin/backends") as resp:
                listed = {b["url"]: b["healthy"] for b in (await resp.json())["backends"]}
    assert listed == {up.url: True, down: False}


async def test_no_backend_left_is_503_and_recorded(
    store: Store, sdk: OpenAIFactory, caplog: pytest.LogCaptureFixture
) -> None:
    async with fake_engine() as engine, running_proxy(store, engine.url) as proxy:
        await engine.server.close()
        rollout_id, key = await new_rollout(store)
        client = sdk(f"{proxy.url}/r/{key}/v1", max_retries=0)

        with pytest.raises(openai.InternalServerError) as caught:
            await client.chat.completions.create(model="m", messages=MESSAGES)

        assert caught.value.status_code == 503
        (call,) = await store.calls(rollout_id)
        assert (call.status, call.http_status) == (CallStatus.FAILED, 503)
    # One backend: nothing to fail over to, and the log does not claim it.
    failures = [
        r.getMessage() for r in caplog.records if "failed before answering" in r.getMessage()
    ]
    assert failures
    assert not any("failing over" in m for m in failures)
