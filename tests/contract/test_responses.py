"""Answers built with the engines' own response classes and serialized as their servers do
(tests/contract/vllm_answers.py, sglang_answers.py) go through rolltap's capture: the store
records exactly the prompt ids, answer ids and logprobs the engine sent (logprobs as float32, the
store's type), whole and streamed, on the chat route (reasoning and a tool call parsed by the
engine), on token-in's route (vLLM's completions, SGLang's /generate) and on token-in's chat
route."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import numpy as np
import pytest
from aiohttp.test_utils import TestServer

from rolltap.proxy.tokenin.options import TokenInOptions
from rolltap.store import Store
from tests.contract.sglang_answers import SGLangAnswers
from tests.contract.vllm_answers import CALL_ID, VLLMAnswers
from tests.support.fake_vllm import Reply
from tests.support.proxy import new_rollout, running_proxy

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
CALL = Reply(
    text="",
    reasoning="look first",
    tool_calls=[{"name": "bash", "arguments": json.dumps({"command": "ls /"})}],
)
MODES = {
    "normal": ({}, {}),
    "token-in": (
        {"token_in": TokenInOptions(reasoning_parser="qwen3", tool_call_parser="hermes")},
        {"token_in": True},
    ),
    "token-in-chat-route": ({"token_in": TokenInOptions(enabled=True, route="chat")}, {}),
}


async def _ask(base: str, messages: list[dict[str, Any]], stream: bool) -> dict[str, Any]:
    """One chat call; the assistant message the client got (a stream folded)."""
    body = {"model": "m", "messages": messages, "tools": TOOLS, "stream": stream}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{base}/chat/completions", json=body) as resp:
            raw = await resp.read()
            assert resp.status == 200, raw[:500]
    if not stream:
        return dict(json.loads(raw)["choices"][0]["message"])
    message: dict[str, Any] = {"content": "", "reasoning": "", "tool_calls": []}
    for line in raw.decode().splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        for choice in json.loads(line[6:]).get("choices") or ():
            delta = choice.get("delta") or {}
            message["content"] += delta.get("content") or ""
            message["reasoning"] += delta.get("reasoning") or delta.get("reasoning_content") or ""
            for call in delta.get("tool_calls") or ():
                if call.get("id"):
                    message["tool_calls"].append({**call, "function": dict(call["function"])})
                else:
                    message["tool_calls"][-1]["function"]["arguments"] += call["function"][
                        "arguments"
                    ]
    return message


ROUTES = {
    ("vllm", "normal"): ["/v1/chat/completions"] * 2,
    ("vllm", "token-in"): ["/v1/chat/completions", "/v1/completions"],
    ("vllm", "token-in-chat-route"): ["/v1/chat/completions"] * 2,
    ("sglang", "normal"): ["/v1/chat/completions"] * 2,
    ("sglang", "token-in"): ["/v1/chat/completions", "/generate"],
    ("sglang", "token-in-chat-route"): ["/v1/chat/completions"] * 2,
}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("kind", ["vllm", "sglang"])
async def test_engine_answers_are_recorded_exactly(
    store: Store, kind: str, mode: str, stream: bool, request: pytest.FixtureRequest
) -> None:
    engine: VLLMAnswers | SGLangAnswers
    if kind == "vllm":
        request.getfixturevalue("vllm")
        engine = VLLMAnswers(reply=CALL)
    else:
        engine = SGLangAnswers(request.getfixturevalue("sglang"), reply=CALL)
    server = TestServer(engine.app())
    await server.start_server()
    settings, meta = MODES[mode]
    url = str(server.make_url("")).rstrip("/")
    backend = url if kind == "vllm" else f"sglang={url}"
    try:
        async with running_proxy(store, backend, **settings) as proxy:
            rollout_id, key = await new_rollout(store, task_id="t", meta=meta)
            base = f"{proxy.url}/r/{key}/v1"
            messages: list[dict[str, Any]] = [{"role": "user", "content": "list /"}]
            first = await _ask(base, messages, stream)
            engine.reply = engine.completion = Reply(text="done", reasoning="it listed")
            call = first["tool_calls"][0]
            messages += [
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": call["id"], "content": "bin etc"},
            ]
            second = await _ask(base, messages, stream)
    finally:
        await server.close()

    # The engine's parsed answer reached the client (its call id as the engine made it).
    assert call["id"] == CALL_ID
    assert json.loads(call["function"]["arguments"]) == {"command": "ls /"}
    assert _reasoning(first) == "look first"
    assert (second["content"], _reasoning(second)) == ("done", "it listed")
    assert [a.path for a in engine.answered] == ROUTES[kind, mode]
    calls = sorted(await store.calls(rollout_id), key=lambda c: c.seq)
    assert [c.bridge for c in calls][1:] == ([None] if mode == "normal" else ["bridged"])
    for answered, recorded in zip(engine.answered, calls, strict=True):
        tokens = await store.call_tokens(recorded.id)
        assert tokens.prompt_ids.tolist() == answered.prompt
        (choice,) = tokens.choices
        assert choice.token_ids.tolist() == answered.ids
        assert choice.logprobs is not None
        assert choice.logprobs.dtype == np.float32
        assert choice.logprobs.tolist() == np.asarray(answered.logprobs, np.float32).tolist()


def _reasoning(message: dict[str, Any]) -> Any:
    """vLLM's `reasoning`, SGLang's `reasoning_content` (a stream folded: either)."""
    return message.get("reasoning") or message.get("reasoning_content")
