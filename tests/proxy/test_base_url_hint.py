"""A harness given the rollout's base URL without `/v1` gets the SDK's own 404 error, and its
message says which path was meant; the key never appears in it."""

from __future__ import annotations

import aiohttp
import openai
import pytest

from rolltap.store import Store
from tests.support.proxy import OpenAIFactory, fake_engine, new_rollout, running_proxy

MESSAGES = [{"role": "user", "content": "hello"}]


async def test_chat_without_v1_names_the_route_it_meant(store: Store, sdk: OpenAIFactory) -> None:
    _, key = await new_rollout(store, task_id="t")
    async with fake_engine() as engine, running_proxy(store, engine.url) as proxy:
        client = sdk(f"{proxy.url}/r/{key}", max_retries=0)
        with pytest.raises(openai.NotFoundError) as caught:
            await client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
        assert caught.value.body == {
            "message": "no route for POST /r/<key>/chat/completions; did you mean "
            "/r/<key>/v1/chat/completions? the base URL ends in /v1",
            "type": "not_found_error",
            "param": None,
            "code": None,
        }
        # With /v1 the same call is answered; a path that is no route with /v1 either gets no
        # hint; the key is never echoed.
        ok = await sdk(f"{proxy.url}/r/{key}/v1").chat.completions.create(
            model="m",
            messages=MESSAGES,  # type: ignore[arg-type]
        )
        assert ok.choices
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{proxy.url}/r/{key}/nothing/here", json={}) as resp:
                assert resp.status == 404
                body = await resp.json()
            assert body["error"]["message"] == "no route for POST /r/<key>/nothing/here"
            async with session.get(f"{proxy.url}/models") as resp:
                text = await resp.text()
            assert "did you mean /v1/models? the base URL ends in /v1" in text
            assert key not in text


async def test_messages_without_v1_answer_in_anthropic_shape(store: Store) -> None:
    _, key = await new_rollout(store, task_id="t")
    async with fake_engine() as engine, running_proxy(store, engine.url) as proxy:
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{proxy.url}/r/{key}/messages", json={}) as resp:
                assert resp.status == 404
                body = await resp.json()
    assert body == {
        "type": "error",
        "error": {
            "type": "not_found_error",
            "message": "no route for POST /r/<key>/messages; did you mean /r/<key>/v1/messages?"
            " the base URL ends in /v1",
        },
    }
