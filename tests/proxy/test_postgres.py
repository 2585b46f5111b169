"""The proxy's hot path on PostgreSQL: many rollouts at once, streamed and not, recorded exactly."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest

from rolltap.store import CallStatus, Store
from tests.support.databases import PostgresServer
from tests.support.fake_vllm import IM_END, encode, render
from tests.support.proxy import OpenAIFactory, fake_engine, running_proxy
from tests.support.stores import opened_store

pytestmark = pytest.mark.postgres


@pytest.fixture
def pg_url(postgres: PostgresServer) -> Iterator[str]:
    name = postgres.fresh()
    try:
        yield postgres.url(name)
    finally:
        postgres.drop(name)


@pytest.fixture
async def pg_store(pg_url: str) -> AsyncIterator[Store]:
    async with opened_store(pg_url) as store:
        yield store


async def test_concurrent_rollouts_on_postgres(pg_store: Store, sdk: OpenAIFactory) -> None:
    async with fake_engine() as engine, running_proxy(pg_store, engine.url) as proxy:
        rollouts = [await pg_store.create_rollout() for _ in range(16)]

        async def conversation(key: str, stream: bool) -> None:
            client = sdk(f"{proxy.url}/r/{key}/v1")
            history = [{"role": "user", "content": f"hello {key[-6:]}"}]
            for turn in range(3):
                if stream:
                    text = ""
                    async for chunk in await client.chat.completions.create(
                        model="m",
                        messages=history,
                        stream=True,  # type: ignore[arg-type]
                    ):
                        text += chunk.choices[0].delta.content or ""
                else:
                    reply = await client.chat.completions.create(model="m", messages=history)  # type: ignore[arg-type]
                    text = reply.choices[0].message.content or ""
                history += [
                    {"role": "assistant", "content": text},
                    {"role": "user", "content": f"turn {turn}"},
                ]

        await asyncio.gather(*(conversation(r.key, i % 2 == 0) for i, r in enumerate(rollouts)))

        for r in rollouts:
            calls = await pg_store.calls(r.id)
            assert [c.status for c in calls] == [CallStatus.OK] * 3
            tokens = list((await pg_store.rollout_tokens(r.id)).values())
            first_user = f"hello {r.key[-6:]}"
            assert tokens[0].prompt_ids.tolist() == render(
                [{"role": "user", "content": first_user}], None
            )
            assert tokens[0].choices[0].token_ids.tolist() == [
                *encode(f"echo: {first_user}"),
                IM_END,
            ]
