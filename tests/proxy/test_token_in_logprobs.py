"""Token-in answers carry logprobs as the chat route would: whole entries (bytes, top
logprobs) when the client asks, none when it does not, and captured either way. The fake
engine's `/tokenize` renders the bridges; its token-in route answers the continuation."""

from __future__ import annotations

from typing import Any

import aiohttp
import numpy as np
import pytest

from rolltap.store import Store
from tests.support.fake_vllm import logprob_of
from tests.support.proxy import fake_engine, new_rollout, running_proxy


@pytest.mark.parametrize("asked", [False, True], ids=["not-asked", "asked"])
async def test_token_in_logprobs(store: Store, asked: bool) -> None:
    options: dict[str, Any] = {"logprobs": True, "top_logprobs": 1} if asked else {}
    async with (
        fake_engine() as engine,
        running_proxy(store, engine.url) as proxy,
        aiohttp.ClientSession() as http,
    ):
        rollout_id, key = await new_rollout(store, task_id="t", meta={"token_in": True})
        url = f"{proxy.url}/r/{key}/v1/chat/completions"
        messages: list[dict[str, Any]] = [{"role": "user", "content": "hello"}]
        for turn in range(2):
            body = {"model": "fake-model", "messages": messages, **options}
            async with http.post(url, json=body) as resp:
                assert resp.status == 200, await resp.text()
                doc = await resp.json()
            (choice,) = doc["choices"]
            messages += [choice["message"], {"role": "user", "content": f"more {turn}"}]

    calls = await store.calls(rollout_id)
    assert [c.bridge for c in calls] == ["first_turn", "bridged"]
    assert choice["message"]["content"] == "continued"
    tokens = await store.call_tokens(calls[1].id)
    ids = tokens.choices[0].token_ids
    expected = [logprob_of(int(i)) for i in ids]
    assert np.allclose(tokens.choices[0].logprobs, expected)  # captured either way
    if not asked:
        assert choice.get("logprobs") is None
        return
    entries = choice["logprobs"]["content"]
    assert [e["logprob"] for e in entries] == pytest.approx(expected)
    for entry in entries:
        assert entry["bytes"] == list(entry["token"].encode())
        assert [t["token"] for t in entry["top_logprobs"]] == [entry["token"]]
