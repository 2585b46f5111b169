"""An SGLang backend (`sglang=URL`): rolltap asks for SGLang's own id fields and records them."""

from __future__ import annotations

import pytest

from rolltap.store import Capture, Store
from tests.support.fake_vllm import IM_END, FakeVLLM, encode, render
from tests.support.proxy import OpenAIFactory, fake_engine, new_rollout, running_proxy

MESSAGES = [{"role": "user", "content": "hello sglang"}]


@pytest.mark.parametrize("stream", [False, True])
async def test_sglang_ids_are_recorded_and_hidden(
    store: Store, sdk: OpenAIFactory, stream: bool
) -> None:
    fake = FakeVLLM(sglang=True, weight_version="w7")
    async with fake_engine(fake) as engine, running_proxy(store, f"sglang={engine.url}") as proxy:
        rollout_id, key = await new_rollout(store)
        client = sdk(f"{proxy.url}/r/{key}/v1")

        if stream:
            chunks = [
                c
                async for c in await client.chat.completions.create(
                    model="m",
                    messages=MESSAGES,
                    stream=True,  # type: ignore[arg-type]
                )
            ]
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            assert all(c.choices for c in chunks)  # the sglext chunk never reaches the client
            assert all("sglext" not in (c.model_extra or {}) for c in chunks)
        else:
            reply = await client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
            text = reply.choices[0].message.content or ""
            extra = reply.choices[0].model_extra or {}
            assert not {"prompt_token_ids", "response_token_ids", "meta_info"} & set(extra)

        assert text == "echo: hello sglang"
        _, _, sent = fake.requests[-1]
        if stream:
            assert sent["return_output_ids_in_sglext"] is True
            assert "return_token_ids" not in sent
        else:
            assert (sent["return_token_ids"], sent["return_prompt_token_ids"]) == (True, True)
        (call,) = await store.calls(rollout_id)
        assert call.capture is Capture.TOKENS
        tokens = await store.call_tokens(call.id)
        assert tokens.prompt_ids.tolist() == render(MESSAGES, None)
        assert tokens.choices[0].token_ids.tolist() == [*encode(text), IM_END]
        if not stream:
            assert call.weight_version == "w7"
