"""Chat Completions through the proxy with the official openai SDK: what the client sees is what
the engine sent (minus rolltap's extras, and an empty `tool_calls` list OpenAI would not send),
and the store holds the engine's exact ids and logprobs.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import aiohttp
import numpy as np
import openai
import orjson
import pytest

from rolltap.engine.launch import EngineProcess
from rolltap.store import CallStatus, Capture, Store
from tests.support.fake_vllm import IM_END, FakeVLLM, NoIds, Reply, encode, logprob_of, render
from tests.support.proxy import OpenAIFactory, fake_engine, new_rollout, running_proxy

MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Say hi to the proxy"},
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "shell",
            "description": "run a command",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
        },
    }
]


def expected_completion(text: str) -> list[int]:
    return [*encode(text), IM_END]


async def assert_recorded(
    store: Store,
    rollout_id: str,
    messages: list[dict[str, Any]],
    texts: list[str],
    tools: list[Any] | None = None,
) -> None:
    (call,) = await store.calls(rollout_id)
    assert call.status is CallStatus.OK
    assert call.capture is Capture.TOKENS
    tokens = await store.call_tokens(call.id)
    assert tokens.prompt_ids.tolist() == render(messages, tools)
    for choice, text in zip(tokens.choices, texts, strict=True):
        ids = expected_completion(text)
        assert choice.token_ids.tolist() == ids
        assert choice.logprobs is not None
        np.testing.assert_array_equal(
            choice.logprobs, np.asarray([logprob_of(i) for i in ids], dtype=np.float32)
        )


async def test_async_sdk_non_streaming(store: Store, sdk: OpenAIFactory) -> None:
    async with fake_engine() as engine, running_proxy(store, engine.url) as proxy:
        rollout_id, key = await new_rollout(store)
        client = sdk(f"{proxy.url}/r/{key}/v1")

        reply = await client.chat.completions.create(model="fake-model", messages=MESSAGES)

        assert reply.choices[0].message.content == "echo: Say hi to the proxy"
        assert reply.choices[0].logprobs is None
        extra = reply.model_extra or {}
        assert "prompt_token_ids" not in extra
        assert "token_ids" not in (reply.choices[0].model_extra or {})
        await assert_recorded(store, rollout_id, MESSAGES, ["echo: Say hi to the proxy"])
        # The engine was asked for ids and logprobs and told which rollout this is.
        _, headers, body = engine.fake.requests[-1]
        assert body["return_token_ids"] is True
        assert body["logprobs"] is True
        assert headers["X-Session-ID"] == rollout_id
        (call,) = await store.calls(rollout_id)
        assert headers["X-Request-Id"] == call.id


async def test_sync_sdk_streaming_with_usage(store: Store) -> None:
    async with fake_engine() as engine, running_proxy(store, engine.url) as proxy:
        rollout_id, key = await new_rollout(store)
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=key)

        def run() -> tuple[str, Any, int]:
            stream = client.chat.completions.create(
                model="fake-model",
                messages=MESSAGES,
                stream=True,
                stream_options={"include_usage": True},
            )
            text, usage, chunks = "", None, 0
            for chunk in stream:
                chunks += 1
                assert "token_ids" not in str(chunk.model_extra)
                if chunk.usage is not None:
                    usage = chunk.usage
                for choice in chunk.choices:
                    text += choice.delta.content or ""
            return text, usage, chunks

        text, usage, _ = await asyncio.to_thread(run)

        assert text == "echo: Say hi to the proxy"
        assert usage is not None
        assert usage.completion_tokens == len(expected_completion(text))
        await assert_recorded(store, rollout_id, MESSAGES, [text])
        (call,) = await store.calls(rollout_id)
        assert call.stream is True
        assert call.first_token_at is not None
        assert call.received_at <= call.first_token_at <= call.finished_at  # type: ignore[operator]


async def test_usage_chunk_is_hidden_unless_asked(store: Store, sdk: OpenAIFactory) -> None:
    async with fake_engine() as engine, running_proxy(store, engine.url) as proxy:
        rollout_id, key = await new_rollout(store)
        client = sdk(f"{proxy.url}/r/{key}/v1")

        chunks = [
            c
            async for c in await client.chat.completions.create(
                model="m", messages=MESSAGES, stream=True
            )
        ]

        assert all(c.usage is None for c in chunks)
        assert all(c.choices for c in chunks)
        # rolltap asked the engine for usage anyway, and recorded it.
        assert engine.fake.requests[-1][2]["stream_options"] == {"include_usage": True}
        (call,) = await store.calls(rollout_id)
        assert call.usage is not None
        assert call.usage["completion_tokens"] == call.completion_tokens


@pytest.mark.parametrize("stream", [False, True])
async def test_tool_calls_and_n_choices(store: Store, stream: bool, sdk: OpenAIFactory) -> None:
    def script(body: dict[str, Any]) -> Reply:
        return Reply(text="", tool_calls=[{"name": "shell", "arguments": '{"cmd": "ls -la"}'}])

    async with (
        fake_engine(FakeVLLM(script=script)) as engine,
        running_proxy(store, engine.url) as proxy,
    ):
        rollout_id, key = await new_rollout(store)
        client = sdk(f"{proxy.url}/r/{key}/v1")

        if stream:
            calls: dict[tuple[int, int], dict[str, str]] = {}
            async for chunk in await client.chat.completions.create(
                model="m", messages=MESSAGES, tools=TOOLS, tool_choice="auto", n=2, stream=True
            ):
                for choice in chunk.choices:
                    for tc in choice.delta.tool_calls or ():
                        entry = calls.setdefault((choice.index, tc.index), {"name": "", "args": ""})
                        entry["name"] += tc.function.name or "" if tc.function else ""
                        entry["args"] += tc.function.arguments or "" if tc.function else ""
            assert calls == {
                (0, 0): {"name": "shell", "args": '{"cmd": "ls -la"}'},
                (1, 0): {"name": "shell", "args": '{"cmd": "ls -la"}'},
            }
        else:
            reply = await client.chat.completions.create(
                model="m", messages=MESSAGES, tools=TOOLS, tool_choice="auto", n=2
            )
            assert len(reply.choices) == 2
            for choice in reply.choices:
                assert choice.finish_reason == "tool_calls"
                (tc,) = choice.message.tool_calls or []
                assert tc.function.name == "shell"  # type: ignore[union-attr]
                assert tc.function.arguments == '{"cmd": "ls -la"}'  # type: ignore[union-attr]

        raw = '<tool_call>{"name":"shell","arguments":{"cmd":"ls -la"}}</tool_call>'
        await assert_recorded(store, rollout_id, MESSAGES, [raw, " #1" + raw], TOOLS)
        (call,) = await store.calls(rollout_id)
        assert call.n_choices == 2
        assert call.finish_reason == "tool_calls"


class EmptyCallLists(FakeVLLM):
    """An engine that sends `tool_calls: []` with every message and delta that has no call, as
    rolltap's built-in engine does with whole answers and some vLLM versions with deltas."""

    def _said(self, message: dict[str, Any]) -> dict[str, Any]:
        said = super()._said(message)
        return said if said.get("tool_calls") else {**said, "tool_calls": []}


def _messages_said(raw: bytes, stream: bool) -> list[dict[str, Any]]:
    """The whole answer's messages, or every delta of a streamed one."""
    if not stream:
        return [c["message"] for c in orjson.loads(raw)["choices"]]
    frames = [line[6:] for line in raw.split(b"\n") if line.startswith(b"data: {")]
    return [c["delta"] for frame in frames for c in orjson.loads(frame)["choices"]]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("logprobs", [False, True])
async def test_an_answer_without_calls_has_no_tool_calls_list(
    store: Store, sdk: OpenAIFactory, stream: bool, logprobs: bool
) -> None:
    """OpenAI leaves `tool_calls` out of an answer without calls (its SDK reads None), where
    the engine sent an empty list; an answer with calls keeps them."""
    async with (
        fake_engine(EmptyCallLists()) as engine,
        running_proxy(store, engine.url) as proxy,
    ):
        _, key = await new_rollout(store)
        body = {"model": "m", "messages": MESSAGES, "stream": stream, "logprobs": logprobs}
        direct = await _raw_post(f"{engine.url}/v1/chat/completions", body, {})
        via_proxy = await _raw_post(f"{proxy.url}/r/{key}/v1/chat/completions", body, {})
        client = sdk(f"{proxy.url}/r/{key}/v1")
        if stream:
            seen = [
                choice.delta.tool_calls
                async for chunk in await client.chat.completions.create(
                    model="m", messages=MESSAGES, stream=True
                )
                for choice in chunk.choices
            ]
        else:
            reply = await client.chat.completions.create(model="m", messages=MESSAGES)
            seen = [reply.choices[0].message.tool_calls]

    # The engine's whole message, or each of its deltas that carries text, had the empty list.
    direct_said = [s for s in _messages_said(direct, stream) if s.get("content")]
    assert direct_said
    assert all(said.get("tool_calls") == [] for said in direct_said)
    assert not any("tool_calls" in said for said in _messages_said(via_proxy, stream))
    assert seen
    assert seen == [None] * len(seen)


@pytest.mark.model
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_the_built_in_engines_answer_without_calls_has_no_tool_calls_list(
    store: Store, smollm_engine: EngineProcess, stream: bool
) -> None:
    async with running_proxy(store, smollm_engine.url) as proxy:
        _, key = await new_rollout(store)
        body = {
            "model": smollm_engine.model,
            "messages": MESSAGES,
            "max_tokens": 4,
            "stream": stream,
            "tools": TOOLS,
        }
        via_proxy = await _raw_post(f"{proxy.url}/r/{key}/v1/chat/completions", body, {})

    said = _messages_said(via_proxy, stream)
    assert said
    assert not any("tool_calls" in s for s in said), via_proxy[:600]


async def test_logprobs_when_the_client_asks(store: Store, sdk: OpenAIFactory) -> None:
    async with fake_engine() as engine, running_proxy(store, engine.url) as proxy:
        rollout_id, key = await new_rollout(store)
        client = sdk(f"{proxy.url}/r/{key}/v1")

        reply = await client.chat.completions.create(
            model="m", messages=MESSAGES, logprobs=True, top_logprobs=1
        )

        content = reply.choices[0].logprobs.content  # type: ignore[union-attr]
        ids = expected_completion("echo: Say hi to the proxy")
        assert [c.logprob for c in content or []] == [logprob_of(i) for i in ids]
        assert engine.fake.requests[-1][2]["top_logprobs"] == 1
        await assert_recorded(store, rollout_id, MESSAGES, ["echo: Say hi to the proxy"])


async def _raw_post(url: str, body: dict[str, Any], headers: dict[str, str]) -> bytes:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            url, data=orjson.dumps(body), headers={"Content-Type": "application/json", **headers}
        ) as resp,
    ):
        assert resp.status == 200
        return await resp.read()


def _same_clock(data: bytes) -> bytes:
    return re.sub(rb'"created":\d+', b'"created":0', data)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("logprobs", [False, True])
async def test_client_gets_the_engines_bytes(store: Store, stream: bool, logprobs: bool) -> None:
    """Byte for byte what the engine answers the same request without the proxy."""
    async with fake_engine() as engine, running_proxy(store, engine.url) as proxy:
        _, key = await new_rollout(store)
        body = {"model": "m", "messages": MESSAGES, "stream": stream, "logprobs": logprobs}
        request_id = {"X-Request-Id": "same-id"}

        direct = await _raw_post(f"{engine.url}/v1/chat/completions", body, request_id)
        via_proxy = await _raw_post(f"{proxy.url}/r/{key}/v1/chat/completions", body, {})

        # The proxy tags the engine request with the call id; give the direct one the same id.
        _, headers, _ = engine.fake.requests[-1]
        direct = direct.replace(b"chatcmpl-same-id", f"chatcmpl-{headers['X-Request-Id']}".encode())
        assert _same_clock(via_proxy) == _same_clock(direct)


async def test_client_that_asks_for_ids_gets_them(store: Store, sdk: OpenAIFactory) -> None:
    async with fake_engine() as engine, running_proxy(store, engine.url) as proxy:
        _, key = await new_rollout(store)
        client = sdk(f"{proxy.url}/r/{key}/v1")

        reply = await client.chat.completions.create(
            model="m", messages=MESSAGES, extra_body={"return_token_ids": True}
        )

        assert (reply.model_extra or {})["prompt_token_ids"] == render(MESSAGES, None)


async def test_models_passes_through_the_backend_list(store: Store, sdk: OpenAIFactory) -> None:
    async with fake_engine() as engine, running_proxy(store, engine.url) as proxy:
        _, key = await new_rollout(store)
        client = sdk(f"{proxy.url}/r/{key}/v1")

        models = await client.models.list()

        assert [m.id for m in models.data] == ["fake-model"]


async def test_plain_openai_backend_is_recorded_as_text_only(
    store: Store, sdk: OpenAIFactory
) -> None:
    def script(body: dict[str, Any]) -> Reply:
        return Reply(text="echo: Say hi to the proxy", fault=NoIds())

    async with (
        fake_engine(FakeVLLM(script=script)) as engine,
        running_proxy(store, engine.url) as proxy,
    ):
        rollout_id, key = await new_rollout(store)
        client = sdk(f"{proxy.url}/r/{key}/v1")

        reply = await client.chat.completions.create(model="m", messages=MESSAGES)

        assert reply.choices[0].message.content == "echo: Say hi to the proxy"
        (call,) = await store.calls(rollout_id)
        assert call.status is CallStatus.OK
        assert call.capture is Capture.TEXT
        assert "text only" in (call.error or "")
        tokens = await store.call_tokens(call.id)
        assert tokens.choices == []
        assert len(tokens.prompt_ids) == 0


async def test_fields_that_would_suppress_ids_never_reach_the_engine(
    store: Store, sdk: OpenAIFactory
) -> None:
    async with fake_engine() as engine, running_proxy(store, engine.url) as proxy:
        rollout_id, key = await new_rollout(store)
        client = sdk(f"{proxy.url}/r/{key}/v1")

        await client.chat.completions.create(
            model="m", messages=MESSAGES, extra_body={"include_reasoning": False}
        )

        _, _, sent = engine.fake.requests[-1]
        # vLLM nulls every token id and logprob when include_reasoning is false.
        assert "include_reasoning" not in sent
        assert sent["return_token_ids"] is True
        (call,) = await store.calls(rollout_id)
        assert call.capture is Capture.TOKENS
        # The client's own request is recorded as it sent it.
        assert b'"include_reasoning":false' in ((await store.call_bodies(call.id)).request or b"")
