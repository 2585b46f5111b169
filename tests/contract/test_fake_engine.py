"""The fake engine (tests/support/fake_vllm.py) answers what the real engines' own response
classes accept, so the proxy's tests cannot pass against a wire format no engine speaks: every
whole answer and every stream chunk validates, and carries no key the class does not have
(vLLM's response models log unknown keys with the same rule as its requests; SGLang's chat
models drop them; `/generate` is checked by SGLang's JSON contract and its fields)."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from tests.contract import engines
from tests.support.fake_vllm import CONTEXT, FakeVLLM, Reply, render

pytestmark = pytest.mark.contract

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]
MESSAGES = [{"role": "user", "content": "list /"}]
REPLY = Reply(
    text="",
    reasoning="look first",
    tool_calls=[{"name": "bash", "arguments": json.dumps({"command": "ls /"})}],
)


async def _served(fake: FakeVLLM, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The answer's JSON documents: one for a whole answer, each `data:` event of a stream."""
    server = TestServer(fake.app())
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as session:
            async with session.post(server.make_url(path), json=body) as resp:
                raw = await resp.read()
                assert resp.status == 200, raw[:300]
    finally:
        await server.close()
    if not body.get("stream"):
        return [json.loads(raw)]
    events = [line[6:] for line in raw.decode().splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def _chat(stream: bool, **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": MESSAGES, "tools": TOOLS, "stream": stream, **extra}


VLLM_ASKED = {"logprobs": True, "top_logprobs": 1, "return_token_ids": True}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("route", ["chat", "completions"])
async def test_the_fake_answers_as_vllm_does(vllm: None, route: str, stream: bool) -> None:
    from vllm.entrypoints.openai.chat_completion.protocol import (
        ChatCompletionResponse,
        ChatCompletionStreamResponse,
    )
    from vllm.entrypoints.openai.completion.protocol import (
        CompletionResponse,
        CompletionStreamResponse,
    )

    fake = FakeVLLM(script=lambda body: REPLY, completion_script=lambda prompt: REPLY)
    if route == "chat":
        body = _chat(stream, **VLLM_ASKED)
        path, whole, chunk = (
            "/v1/chat/completions",
            ChatCompletionResponse,
            ChatCompletionStreamResponse,
        )
    else:
        body = {"model": "m", "prompt": render(MESSAGES, TOOLS), "logprobs": 1, "max_tokens": None}
        body |= {"return_token_ids": True, "stream": stream}
        path, whole, chunk = "/v1/completions", CompletionResponse, CompletionStreamResponse
    if stream:
        body["stream_options"] = {"include_usage": True}
    docs = await _served(fake, path, body)
    model = chunk if stream else whole
    problems = []
    for k, doc in enumerate(docs):
        _, ignored = engines.vllm_validate(model, doc)
        problems += [f"{path} #{k}: vLLM has no {key!r}" for key in sorted(ignored)]
    assert problems == [], "\n".join(problems)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_the_fake_answers_chat_as_sglang_does(sglang: engines.SGLang, stream: bool) -> None:
    protocol = sglang.protocol
    fake = FakeVLLM(script=lambda body: REPLY, sglang=True)
    # What rolltap asks SGLang for (proxy/upstream/engines.py).
    if stream:
        asked = {"return_input_ids_in_sglext": True, "return_output_ids_in_sglext": True}
        asked["stream_options"] = {"include_usage": True}
    else:
        asked = {"return_prompt_token_ids": True, "return_token_ids": True}
        asked["return_meta_info"] = True
    docs = await _served(fake, "/v1/chat/completions", _chat(stream, logprobs=True, **asked))
    model = protocol.ChatCompletionStreamResponse if stream else protocol.ChatCompletionResponse
    problems = []
    for k, doc in enumerate(docs):
        validated = model.model_validate(doc)
        lost = engines.pydantic_ignored(validated, doc)
        problems += [f"chat #{k}: SGLang has no {key!r}" for key in sorted(lost)]
    assert problems == [], "\n".join(problems)
    if stream:
        # serving_chat.py: the finish_reason chunk, the sglext chunk, the usage chunk.
        tail = [next(iter({"sglext", "usage"} & set(doc)), "choices") for doc in docs[-3:]]
        assert tail == ["choices", "sglext", "usage"]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_the_fake_answers_generate_as_sglang_does(
    sglang: engines.SGLang, stream: bool
) -> None:
    api = sglang.api_types
    fake = FakeVLLM(completion_script=lambda prompt: REPLY, sglang=True)
    body = {
        "input_ids": render(MESSAGES, TOOLS),
        "sampling_params": {"max_new_tokens": 200, "temperature": 1.0},
        "return_logprob": True,
        "logprob_start_len": -1,
        "top_logprobs_num": 0,
        "stream": stream,
    }
    problems = []
    for k, doc in enumerate(await _served(fake, "/generate", body)):
        decoded = api.GenerateResponse.from_json_value(doc)
        problems += [
            f"#{k}: no {key!r}" for key in set(doc) - set(api.GenerateResponse.__struct_fields__)
        ]
        meta = doc.get("meta_info") or {}
        known = set(api.GenerateMetaInfo.__struct_fields__) | {"routed_experts"}
        problems += [f"#{k}: meta_info has no {key!r}" for key in set(meta) - known]
        assert decoded.output_ids == doc["output_ids"]
    assert problems == [], "\n".join(problems)


async def test_the_fake_lists_its_model_as_vllm_does(vllm: None) -> None:
    """rolltap reads `max_model_len` from vLLM's model card (proxy/upstream/forward.py)."""
    from vllm.entrypoints.serve.engine.protocol import ModelList

    server = TestServer(FakeVLLM().app())
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(server.make_url("/v1/models")) as resp:
                doc = await resp.json()
    finally:
        await server.close()
    listed, ignored = engines.vllm_validate(ModelList, doc)
    assert ignored == set()
    assert [(card.owned_by, card.max_model_len) for card in listed.data] == [("vllm", CONTEXT)]
