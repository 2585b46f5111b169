"""Anthropic Messages (Claude Code's dialect) through the proxy, with the official anthropic SDK:
every event parses, the SDK's own stream accumulator builds the message, and the store holds the
engine's exact ids for the chat request the proxy sent.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import anthropic
import numpy as np
import orjson
import pytest

from rolltap.analysis.reading import rollout_trajectories
from rolltap.analysis.turns import ConversationTurn, request_turns, response_turns
from rolltap.proxy.dialects.blocks import Tool
from rolltap.proxy.dialects.dialect import Answer, AnswerEnd
from rolltap.proxy.dialects.messages_render import MessagesRenderer
from rolltap.store import CallDialect, CallStatus, Capture, Store
from tests.support.fake_vllm import (
    IM_END,
    DieAfter,
    FakeVLLM,
    Reply,
    Status,
    encode,
    logprob_of,
    render,
)
from tests.support.proxy import ENGINE_EXTRAS, fake_engine, new_rollout, running_proxy

BASH = {
    "name": "Bash",
    "description": "Run a shell command",
    "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
}
WEB = {"type": "web_search_20250305", "name": "web_search"}
_ADDED = ("parsed_output", "stop_details")


class AnthropicFactory:
    def __init__(self) -> None:
        self._clients: list[anthropic.AsyncAnthropic] = []

    def __call__(self, base_url: str, **kwargs: Any) -> anthropic.AsyncAnthropic:
        kwargs.setdefault("api_key", "unused")
        client = anthropic.AsyncAnthropic(base_url=base_url, max_retries=0, **kwargs)
        self._clients.append(client)
        return client

    async def close(self) -> None:
        for client in self._clients:
            await client.close()


@pytest.fixture
async def claude() -> AsyncIterator[AnthropicFactory]:
    factory = AnthropicFactory()
    try:
        yield factory
    finally:
        await factory.close()


def engine_chat(fake: FakeVLLM, index: int = -1) -> dict[str, Any]:
    return [body for path, _, body in fake.requests if path == "/v1/chat/completions"][index]


def as_sent(model: Any) -> Any:
    """An SDK object as JSON, without the fields the SDK's stream accumulator fills in."""

    def clean(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items() if k not in _ADDED}
        if isinstance(value, list):
            return [clean(v) for v in value]
        return value

    return clean(model.model_dump(mode="json", exclude_unset=True))


async def assert_tokens(store: Store, call_id: str, chat: dict[str, Any], text: str) -> None:
    tokens = await store.call_tokens(call_id)
    assert tokens.prompt_ids.tolist() == render(chat["messages"], chat.get("tools"))
    (choice,) = tokens.choices
    ids = [*encode(text), IM_END]
    assert choice.token_ids.tolist() == ids
    assert choice.logprobs is not None
    np.testing.assert_array_equal(
        choice.logprobs, np.asarray([logprob_of(i) for i in ids], dtype=np.float32)
    )


async def test_text_answer_non_streaming(store: Store, claude: AnthropicFactory) -> None:
    async with fake_engine() as engine, running_proxy(store, engine.url) as proxy:
        rollout_id, key = await new_rollout(store)
        client = claude(f"{proxy.url}/r/{key}")

        message = await client.messages.create(
            model="fake-model",
            max_tokens=200,
            system="Be terse.",
            messages=[{"role": "user", "content": "Say hi to the proxy"}],
        )

        assert [b.type for b in message.content] == ["text"]
        assert message.content[0].text == "echo: Say hi to the proxy"  # type: ignore[union-attr]
        assert message.stop_reason == "end_turn"
        chat = engine_chat(engine.fake)
        assert chat["messages"] == [
            {"role": "system", "content": "Be terse."},
            {"role": "user", "content": "Say hi to the proxy"},
        ]
        assert chat["max_tokens"] == 200
        (call,) = await store.calls(rollout_id)
        assert (call.dialect, call.status, call.capture) == (
            CallDialect.MESSAGES,
            CallStatus.OK,
            Capture.TOKENS,
        )
        await assert_tokens(store, call.id, chat, "echo: Say hi to the proxy")
        assert message.usage.input_tokens == call.prompt_tokens
        assert message.usage.output_tokens == call.completion_tokens
        bodies = await store.call_bodies(call.id)
        assert orjson.loads(bodies.response or b"") == as_sent(message)


def tool_script(body: dict[str, Any]) -> Reply:
    if body["messages"][-1]["role"] == "tool":
        return Reply(text="all done", reasoning="the command ran")
    return Reply(
        text="Listing.",
        reasoning="I should look first.",
        tool_calls=[{"name": "Bash", "arguments": '{"command":  "ls -la"}'}],
    )


@pytest.mark.parametrize("stream", [False, True])
async def test_thinking_text_and_tool_use(
    store: Store, claude: AnthropicFactory, stream: bool
) -> None:
    async with (
        fake_engine(FakeVLLM(script=tool_script)) as engine,
        running_proxy(store, engine.url) as proxy,
    ):
        rollout_id, key = await new_rollout(store)
        client = claude(f"{proxy.url}/r/{key}")
        request: Any = {
            "model": "m",
            "max_tokens": 1000,
            "messages": [{"role": "user", "content": "look around"}],
            "tools": [BASH, WEB],
            "thinking": {"type": "enabled", "budget_tokens": 500},
        }
        kinds: list[str] = []
        if stream:
            async with client.messages.stream(**request) as events:
                async for event in events:
                    kinds.append(event.type)
                message = await events.get_final_message()
        else:
            message = await client.messages.create(**request)

        thinking, text, tool_use = message.content
        assert thinking.type == "thinking"
        assert thinking.thinking == "I should look first."
        assert thinking.signature.startswith("rt1.")
        assert text.type == "text"
        assert text.text == "Listing."
        assert tool_use.type == "tool_use"
        assert (tool_use.name, tool_use.input) == ("Bash", {"command": "ls -la"})
        assert message.stop_reason == "tool_use"
        chat = engine_chat(engine.fake)
        assert [t["function"]["name"] for t in chat["tools"]] == ["Bash"]
        assert "thinking" not in chat
        (call,) = await store.calls(rollout_id)
        assert tool_use.id == f"call_{call.id}_0_0"
        raw = "<think>I should look first.</think>Listing."
        raw += '<tool_call>{"name":"Bash","arguments":{"command":"ls -la"}}</tool_call>'
        await assert_tokens(store, call.id, chat, raw)
        recorded = orjson.loads((await store.call_bodies(call.id)).response or b"")
        assert recorded == as_sent(message)
        if stream:
            assert kinds[0] == "message_start"
            assert kinds[-1] == "message_stop"
            assert "thinking" in kinds
            assert "signature" in kinds
            assert "input_json" in kinds
            assert call.first_token_at is not None


@pytest.mark.parametrize("stream", [False, True])
async def test_sglang_backend(store: Store, claude: AnthropicFactory, stream: bool) -> None:
    """SGLang reports streamed ids only at the end: the count reaches the client there."""
    fake = FakeVLLM(sglang=True)
    async with fake_engine(fake) as engine, running_proxy(store, f"sglang={engine.url}") as proxy:
        rollout_id, key = await new_rollout(store)
        client = claude(f"{proxy.url}/r/{key}")
        request: Any = {
            "model": "m",
            "max_tokens": 100,
            "messages": [{"role": "user", "content": "hi"}],
        }
        if stream:
            async with client.messages.stream(**request) as events:
                message = await events.get_final_message()
        else:
            message = await client.messages.create(**request)

        assert message.content[0].text == "echo: hi"  # type: ignore[union-attr]
        (call,) = await store.calls(rollout_id)
        assert call.capture is Capture.TOKENS
        await assert_tokens(store, call.id, engine_chat(engine.fake), "echo: hi")
        assert message.usage.input_tokens == call.prompt_tokens
        assert message.usage.output_tokens == call.completion_tokens


@pytest.mark.parametrize("thinking", [None, {"type": "adaptive"}])
async def test_an_empty_thinking_block_carries_the_reference_when_thinking_is_on(
    store: Store, claude: AnthropicFactory, thinking: Any
) -> None:
    async with fake_engine() as engine, running_proxy(store, engine.url) as proxy:
        _, key = await new_rollout(store)
        client = claude(f"{proxy.url}/r/{key}")
        extra: Any = {"thinking": thinking} if thinking else {}

        async with client.messages.stream(
            model="m", max_tokens=100, messages=[{"role": "user", "content": "hi"}], **extra
        ) as events:
            message = await events.get_final_message()

        kinds = [b.type for b in message.content]
        if thinking is None:
            assert kinds == ["text"]
        else:
            assert kinds == ["thinking", "text"]
            assert message.content[0].thinking == ""  # type: ignore[union-attr]
            assert message.content[0].signature.startswith("rt1.")  # type: ignore[union-attr]


async def test_claude_code_request_shape(store: Store) -> None:
    """What Claude Code 2.1.330 sends: `?beta=true`, a system message inside `messages`, betas,
    adaptive thinking, context_management, output_config, metadata.user_id."""
    body = {
        "model": "m",
        "max_tokens": 32000,
        "stream": True,
        "system": [
            {"type": "text", "text": "You are a Claude agent.", "cache_control": {"type": "x"}},
            {"type": "text", "text": "Use the Bash tool."},
        ],
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "<system-reminder>x</system-reminder>"},
                    {"type": "text", "text": "Create hello.txt"},
                ],
            },
            {"role": "system", "content": "# Environment\ncwd: /work"},
        ],
        "tools": [BASH],
        "metadata": {"user_id": '{"device_id":"d","session_id":"s"}'},
        "thinking": {"type": "adaptive", "display": "updates"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "high"},
    }
    async with fake_engine() as engine, running_proxy(store, engine.url) as proxy:
        rollout_id, key = await new_rollout(store)
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                f"{proxy.url}/r/{key}/v1/messages?beta=true",
                json=body,
                headers={
                    "anthropic-version": "2023-06-01",
                    "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14",
                    "Authorization": f"Bearer {key}",
                },
            ) as resp,
        ):
            assert resp.status == 200
            assert resp.headers["Content-Type"] == "text/event-stream"
            text = (await resp.read()).decode()

        chat = engine_chat(engine.fake)
        assert chat["messages"] == [
            {
                "role": "system",
                "content": [
                    {"type": "text", "text": "You are a Claude agent."},
                    {"type": "text", "text": "Use the Bash tool."},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "<system-reminder>x</system-reminder>"},
                    {"type": "text", "text": "Create hello.txt"},
                ],
            },
            {"role": "system", "content": "# Environment\ncwd: /work"},
        ]
        sent = set(chat) - ENGINE_EXTRAS
        assert sent == {"model", "messages", "stream", "max_tokens", "tools"}
        frames = [f.split("\n") for f in text.strip().split("\n\n")]
        names = [f[0].removeprefix("event: ") for f in frames]
        assert names[0] == "message_start"
        assert names[-2:] == ["message_delta", "message_stop"]
        for name, data in ((f[0], f[1]) for f in frames):
            assert orjson.loads(data.removeprefix("data: "))["type"] == name.removeprefix("event: ")
        (call,) = await store.calls(rollout_id)
        assert call.status is CallStatus.OK
        assert call.purpose is None


async def test_a_final_assistant_message_is_continued(
    store: Store, claude: AnthropicFactory
) -> None:
    async with fake_engine() as engine, running_proxy(store, engine.url) as proxy:
        _, key = await new_rollout(store)
        client = claude(f"{proxy.url}/r/{key}")

        await client.messages.create(
            model="m",
            max_tokens=50,
            messages=[
                {"role": "user", "content": "Name a colour."},
                {"role": "assistant", "content": "The colour is"},
            ],
        )

        chat = engine_chat(engine.fake)
        assert chat["messages"][-1] == {"role": "assistant", "content": "The colour is"}
        assert chat["continue_final_message"] is True
        assert chat["add_generation_prompt"] is False


@pytest.mark.parametrize("auth", ["api_key", "auth_token"])
async def test_key_as_credential_on_the_root_path(
    store: Store, claude: AnthropicFactory, auth: str
) -> None:
    async with fake_engine() as engine, running_proxy(store, engine.url) as proxy:
        rollout_id, key = await new_rollout(store)
        client = claude(
            proxy.url, **{auth: key, **({"api_key": None} if auth != "api_key" else {})}
        )

        await client.messages.create(
            model="m", max_tokens=50, messages=[{"role": "user", "content": "hi"}]
        )

        assert len(await store.calls(rollout_id)) == 1


async def test_count_tokens_renders_like_the_engine(store: Store, claude: AnthropicFactory) -> None:
    async with fake_engine() as engine, running_proxy(store, engine.url) as proxy:
        rollout_id, key = await new_rollout(store)
        client = claude(f"{proxy.url}/r/{key}")
        messages: Any = [{"role": "user", "content": "how many tokens is this?"}]

        counted = await client.messages.count_tokens(
            model="m", system="Be terse.", messages=messages, tools=[BASH]
        )

        chat_tools = [
            {
                "type": "function",
                "function": {
                    "name": "Bash",
                    "description": BASH["description"],
                    "parameters": BASH["input_schema"],
                },
            }
        ]
        system = {"role": "system", "content": "Be terse."}
        assert counted.input_tokens == len(render([system, *messages], chat_tools))
        tokenized = [body for path, _, body in engine.fake.requests if path == "/tokenize"]
        assert tokenized[0]["add_generation_prompt"] is True
        # Counting is not an LLM call: nothing is recorded.
        assert await store.calls(rollout_id) == []


async def test_count_tokens_estimates_without_a_tokenizer(
    store: Store, claude: AnthropicFactory
) -> None:
    async with fake_engine() as engine, running_proxy(store, f"openai={engine.url}") as proxy:
        _, key = await new_rollout(store)
        client = claude(f"{proxy.url}/r/{key}")

        counted = await client.messages.count_tokens(
            model="m", messages=[{"role": "user", "content": "x" * 400}]
        )

        assert 100 <= counted.input_tokens <= 130
        assert [p for p, _, _ in engine.fake.requests] == []


@pytest.mark.parametrize("method", ["HEAD", "GET"])
@pytest.mark.parametrize("prefix", ["/r/KEY", ""])
async def test_start_up_probe(store: Store, method: str, prefix: str) -> None:
    async with fake_engine() as engine, running_proxy(store, engine.url) as proxy:
        _, key = await new_rollout(store)
        async with (
            aiohttp.ClientSession() as session,
            session.request(method, f"{proxy.url}{prefix.replace('KEY', key)}/api/hello") as resp,
        ):
            assert resp.status == 200


async def _post(url: str, data: bytes, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            url, data=data, headers={"Content-Type": "application/json", **(headers or {})}
        ) as resp,
    ):
        return resp.status, orjson.loads(await resp.read())


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b'{"model": "m", "max_tokens": 5}', 400, "messages"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "x"}]}', 400, "max_tokens"),
        (b'{"max_tokens": 5, "messages": [{"role": "bot", "content": "x"}]}', 400, "messages.0"),
        (b'{"max_tokens": "5", "messages": [{"role": "user", "content": "x"}]}', 400, "integer"),
        (
            b'{"max_tokens": 5, "messages": [{"role": "assistant", "content": [{"type":'
            b' "tool_use", "name": "Bash", "input": {}}]}]}',
            400,
            "messages.0.content.0.id",
        ),
        (
            b'{"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image",'
            b' "source": {"type": "file", "file_id": "f"}}]}]}',
            422,
            "image source",
        ),
    ],
)
async def test_bad_requests_get_anthropic_errors_and_are_recorded(
    store: Store, body: bytes, status: int, fragment: str
) -> None:
    async with fake_engine() as engine, running_proxy(store, engine.url) as proxy:
        rollout_id, key = await new_rollout(store)

        got, doc = await _post(f"{proxy.url}/r/{key}/v1/messages?beta=true", body)

        assert got == status
        assert doc["type"] == "error"
        assert doc["error"]["type"] == "invalid_request_error"
        assert fragment in doc["error"]["message"]
        (call,) = await store.calls(rollout_id)
        assert (call.dialect, call.status, call.http_status) == (
            CallDialect.MESSAGES,
            CallStatus.REJECTED,
            status,
        )
        assert engine.fake.requests == []


async def test_body_over_the_limit_is_413(store: Store) -> None:
    async with (
        fake_engine() as engine,
        running_proxy(store, engine.url, max_body_bytes=2048) as proxy,
    ):
        _, key = await new_rollout(store)
        body = orjson.dumps(
            {"max_tokens": 5, "messages": [{"role": "user", "content": "x" * 4096}]}
        )

        got, doc = await _post(f"{proxy.url}/r/{key}/v1/messages", body)

        assert (got, doc["error"]["type"]) == (413, "request_too_large")


async def test_engine_refusal_in_anthropic_shape(store: Store) -> None:
    message = "This model's maximum context length is 32 tokens. However, you asked for 90."
    fake = FakeVLLM(script=lambda body: Reply(fault=Status(400, message)))
    async with fake_engine(fake) as engine, running_proxy(store, engine.url) as proxy:
        rollout_id, key = await new_rollout(store)

        got, doc = await _post(
            f"{proxy.url}/r/{key}/v1/messages",
            orjson.dumps(
                {"max_tokens": 5, "stream": True, "messages": [{"role": "user", "content": "x"}]}
            ),
        )

        assert got == 400
        # The words Claude Code looks for before it compacts and retries.
        assert doc == {
            "type": "error",
            "error": {"type": "invalid_request_error", "message": f"prompt is too long: {message}"},
        }
        (call,) = await store.calls(rollout_id)
        assert (call.status, call.http_status) == (CallStatus.FAILED, 400)


async def test_engine_failing_mid_stream_sends_an_error_event(
    store: Store, claude: AnthropicFactory
) -> None:
    fake = FakeVLLM(script=lambda body: Reply(text="one two three four", fault=DieAfter(8)))
    async with fake_engine(fake) as engine, running_proxy(store, engine.url) as proxy:
        rollout_id, key = await new_rollout(store)
        client = claude(f"{proxy.url}/r/{key}")

        with pytest.raises(anthropic.APIStatusError) as raised:
            async with client.messages.stream(
                model="m", max_tokens=100, messages=[{"role": "user", "content": "count"}]
            ) as events:
                async for _ in events:
                    pass

        assert raised.value.body == {
            "type": "error",
            "error": {"type": "api_error", "message": "the backend failed mid-stream"},
        }
        (call,) = await store.calls(rollout_id)
        assert (call.status, call.http_status, call.completion_tokens) == (
            CallStatus.FAILED,
            502,
            7,
        )
        partial = orjson.loads((await store.call_bodies(call.id)).response or b"")
        assert partial["content"] == [{"type": "text", "text": "one two"}]


async def test_max_tokens_and_stop_sequences(store: Store, claude: AnthropicFactory) -> None:
    async with fake_engine() as engine, running_proxy(store, engine.url) as proxy:
        _, key = await new_rollout(store)
        client = claude(f"{proxy.url}/r/{key}")

        message = await client.messages.create(
            model="m",
            max_tokens=4,
            stop_sequences=["END"],
            messages=[{"role": "user", "content": "a long story"}],
        )

        assert message.stop_reason == "max_tokens"
        assert message.usage.output_tokens == 4
        assert engine_chat(engine.fake)["stop"] == ["END"]

    # vLLM reports the stop string that ended the answer as `stop_reason`.
    renderer = MessagesRenderer({"stop_sequences": ["END"]}, Answer("c" * 26, 0, "rt1.x"))
    renderer.feed([Tool(0, None, "Bash", "[1, 2]")])
    delta = renderer.finish(AnswerEnd("stop", "END", 3, 4))[0]
    assert delta["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}
    assert renderer.result()["content"][0]["input"] == {}
    assert renderer.notes == ["tool call 0: arguments not a JSON object; sent as {}"]


async def test_retries_and_side_calls(store: Store, claude: AnthropicFactory) -> None:
    async with fake_engine() as engine, running_proxy(store, engine.url) as proxy:
        rollout_id, key = await new_rollout(store)
        client = claude(f"{proxy.url}/r/{key}")
        user: Any = [{"role": "user", "content": "hi"}]

        await client.messages.create(model="m", max_tokens=50, messages=user)
        await client.messages.create(
            model="m", max_tokens=50, messages=user, extra_headers={"x-stainless-retry-count": "2"}
        )
        await client.messages.create(model="m", max_tokens=1, messages=user)
        compaction = "Your task is to create a detailed summary of the conversation so far, ..."
        await client.messages.create(
            model="m", max_tokens=50, messages=[{"role": "user", "content": compaction}]
        )

        first, retry, probe, compact = await store.calls(rollout_id)
        assert (retry.retry_of, retry.retry_count) == (first.id, 2)
        assert (first.purpose, probe.purpose, compact.purpose) == (None, "probe", "compact")


async def test_multi_turn_rollout_is_one_trajectory(store: Store, claude: AnthropicFactory) -> None:
    async with fake_engine() as engine, running_proxy(store, engine.url) as proxy:
        rollout_id, key = await new_rollout(store)
        client = claude(f"{proxy.url}/r/{key}")
        history: list[Any] = [{"role": "user", "content": "turn 0"}]
        for turn in range(1, 4):
            async with client.messages.stream(
                model="m", max_tokens=100, messages=history, thinking={"type": "adaptive"}
            ) as events:
                message = await events.get_final_message()
            history.append({"role": "assistant", "content": [as_sent(b) for b in message.content]})
            history.append({"role": "user", "content": f"turn {turn}"})

        built = await rollout_trajectories(store, rollout_id)
        (trajectory,) = built.trajectories
        assert built.faithfulness.share == 1.0
        calls = await store.calls(rollout_id)
        assert all(c.error is None for c in calls)
        last = await store.call_tokens(calls[-1].id)
        full = trajectory.prompt_ids.tolist() + trajectory.response_ids.tolist()
        assert full == last.prompt_ids.tolist() + last.choices[0].token_ids.tolist()
        bodies = await store.call_bodies(calls[-1].id)
        assert response_turns(CallDialect.MESSAGES, bodies.response) == [
            ConversationTurn("assistant", "echo: turn 2")
        ]
        assert request_turns(CallDialect.MESSAGES, bodies.request)[:2] == [
            ConversationTurn("user", "turn 0"),
            ConversationTurn("assistant", "echo: turn 0"),
        ]
