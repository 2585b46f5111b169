"""rolltap's token capture against vLLM's real OpenAI serving layer: the proxy in front of vLLM
0.33's own API server (build_app + init_app_state, arguments from vLLM's parser) whose engine
client samples with rolltap's built-in model on CPU (tests/support/vllm_serving.py).

What the proxy adds to the request (`logprobs`, `top_logprobs: 0`, `return_token_ids`,
`return_weight_versions`, `cache_salt`, the usage chunk) is parsed by vLLM's request model and
mapped to SamplingParams by vLLM; the ids and logprobs come back in vLLM's own response and chunk
shapes. The call the proxy records must hold exactly the prompt ids vLLM's renderer produced and
the ids and logprobs the engine client sampled, for a whole answer and a streamed one, while the
client, which asked for neither, sees neither."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rolltap.store import CallStatus, Capture, Store
from tests.support.proxy import OpenAIFactory, new_rollout, running_proxy
from tests.support.vllm_serving import SERVED_NAME, missing, vllm_server

pytestmark = [pytest.mark.contract, pytest.mark.model, pytest.mark.slow]

_reason = missing()
if _reason is not None:
    pytest.skip(_reason, allow_module_level=True)

MESSAGES = [{"role": "user", "content": "Name three colours."}]
MAX_TOKENS = 12


async def _assert_recorded(store: Store, rollout_id: str, sampled: dict[str, object]) -> None:
    (call,) = await store.calls(rollout_id)
    assert call.status is CallStatus.OK
    assert call.capture is Capture.TOKENS
    tokens = await store.call_tokens(call.id)
    assert tokens.prompt_ids.tolist() == sampled["prompt_token_ids"]
    (choice,) = tokens.choices
    assert choice.token_ids.tolist() == sampled["token_ids"]
    assert choice.logprobs is not None
    np.testing.assert_array_equal(
        choice.logprobs, np.asarray(sampled["logprobs"], dtype=np.float32)
    )


async def test_proxy_captures_ids_and_logprobs_from_vllms_serving_layer(
    store: Store, sdk: OpenAIFactory, tmp_path: Path
) -> None:
    async with (
        vllm_server(tmp_path / "sampled.jsonl") as vllm,
        running_proxy(store, f"vllm={vllm.url}") as proxy,
    ):
        whole_id, whole_key = await new_rollout(store)
        client = sdk(f"{proxy.url}/r/{whole_key}/v1", max_retries=0)
        reply = await client.chat.completions.create(
            model=SERVED_NAME, messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0
        )
        (whole,) = vllm.sampled()
        assert whole["finish_reason"] in ("stop", "length")
        assert len(whole["token_ids"]) <= MAX_TOKENS
        assert reply.choices[0].message.content
        # The client asked for no logprobs or ids: rolltap's additions stay hidden.
        assert reply.choices[0].logprobs is None
        assert "token_ids" not in (reply.choices[0].model_extra or {})
        await _assert_recorded(store, whole_id, whole)

        streamed_id, streamed_key = await new_rollout(store)
        client = sdk(f"{proxy.url}/r/{streamed_key}/v1", max_retries=0)
        stream = await client.chat.completions.create(
            model=SERVED_NAME,
            messages=MESSAGES,
            max_tokens=MAX_TOKENS,
            temperature=0,
            stream=True,
        )
        text = ""
        async for chunk in stream:
            assert chunk.usage is None  # rolltap asked for the usage chunk, not the client
            for delta in chunk.choices:
                assert delta.logprobs is None
                text += delta.delta.content or ""
        _, streamed = vllm.sampled()
        # Greedy on the same prompt: the same answer, whole or streamed.
        assert streamed["token_ids"] == whole["token_ids"]
        assert text == reply.choices[0].message.content
        await _assert_recorded(store, streamed_id, streamed)
