"""Model names a harness insists on (Claude Code's own ids) through the proxy with the anthropic
SDK: an alias, the one-model default, and a 404 that lists what is served."""

from __future__ import annotations

import anthropic
import pytest
from aiohttp import web

from rolltap.store import Store
from tests.support.fake_vllm import FakeVLLM
from tests.support.proxy import fake_engine, new_rollout, running_proxy

ASK = {"max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}


class OtherModel(FakeVLLM):
    """A second server that lists another model, as a vLLM started with it would."""

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "other", "object": "model"}]})


def _client(proxy_url: str, key: str) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=f"{proxy_url}/r/{key}", api_key="x", max_retries=0)


async def test_one_served_model_answers_any_name(store: Store) -> None:
    async with fake_engine() as engine, running_proxy(store, engine.url) as proxy:
        rollout_id, key = await new_rollout(store)
        answer = await _client(proxy.url, key).messages.create(model="claude-harness-main", **ASK)
    assert answer.model == "claude-harness-main"
    assert engine.fake.requests[-1][2]["model"] == "fake-model"
    (call,) = await store.calls(rollout_id)
    assert (call.model, call.status.value, call.error) == ("claude-harness-main", "ok", None)


async def test_aliases_pick_among_several_models_and_others_get_a_404(store: Store) -> None:
    aliases = {"claude-harness-small": "other"}
    async with (
        fake_engine() as first,
        fake_engine(OtherModel()) as second,
        running_proxy(store, first.url, second.url, model_aliases=aliases) as proxy,
    ):
        _, key = await new_rollout(store)
        client = _client(proxy.url, key)
        await client.messages.create(model="claude-harness-small", **ASK)
        sent = first.fake.requests + second.fake.requests
        assert sent[-1][2]["model"] == "other"
        with pytest.raises(anthropic.NotFoundError) as refused:
            await client.messages.create(model="claude-unknown", **ASK)
    assert refused.value.body["error"]["message"] == (  # type: ignore[index]
        "model 'claude-unknown' is not served here; served: fake-model, other "
        "(`rolltap serve --model-alias NAME=SERVED` maps a name)"
    )
