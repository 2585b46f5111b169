"""The Responses API (Codex's dialect) through the proxy, with the official openai SDK: every event
parses, the SDK's own accumulator builds the response, and the store holds the engine's exact ids
for the chat request the proxy sent.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import numpy as np
import orjson
import pytest

from rolltap.analysis.reading import rollout_trajectories
from rolltap.analysis.turns import ConversationTurn, request_turns, response_turns
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
from tests.support.proxy import (
    ENGINE_EXTRAS,
    OpenAIFactory,
    fake_engine,
    new_rollout,
    running_proxy,
)

SHELL = {
    "type": "function",
    "name": "shell",
    "description": "run a command",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
}
APPLY_PATCH = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Edit files.",
    "format": {"type": "grammar", "syntax": "lark", "definition": "start: patch"},
}
DOCS = {
    "type": "namespace",
    "name": "mcp__docs__",
    "description": "Docs server",
    "tools": [
        {
            "type": "function",
            "name": "search",
            "description": "search the docs",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        }
    ],
}
WEB = {"type": "web_search"}


def engine_chat(fake: FakeVLLM, index: int = -1) -> dict[str, Any]:
    chats = [body for path, _, body in fake.requests if path == "/v1/chat/completions"]
    return chats[index]


def as_sent(model: Any) -> Any:
    """An SDK object as JSON, without what the SDK's stream accumulator adds (`parsed...`)."""

    def clean(value: Any) -> Any:
        if isinstance(value, dict):
            return {
                k: clean(v) for k, v in value.items() if k not in ("parsed", "parsed_arguments")
            }
        if isinstance(value, list):
            return [clean(v) for v in value]
        return value

    return clean(model.model_dump(mode="json", exclude_unset=True))


async def assert_tokens(store: Store, call_id: str, chat: dict[str, Any], text: str) -> None:
    """Prompt ids = the fake's rendering of the chat request sent; completion = the raw answer."""
    tokens = await store.call_tokens(call_id)
    assert tokens.prompt_ids.tolist() == render(chat["messages"], chat.get("tools"))
    (choice,) = tokens.choices
    ids = [*encode(text), IM_END]
    assert choice.token_ids.tolist() == ids
    assert choice.logprobs is not None
    np.testing.assert_array_equal(
        choice.logprobs, np.asarray([logprob_of(i) for i in ids], dtype=np.float32)
    )


async def test_text_answer_non_streaming(store: Store, sdk: OpenAIFactory) -> None:
    async with fake_engine() as engine, running_proxy(store, engine.url) as proxy:
        rollout_id, key = await new_rollout(store)
        client = sdk(f"{proxy.url}/r/{key}/v1")

        response = await client.responses.create(
            model="fake-model", instructions="Be terse.", input="Say hi to the proxy"
        )

        assert response.output_text == "echo: Say hi to the proxy"
        assert response.status == "completed"
        assert [item.type for item in response.output] == ["message"]
        chat = engine_chat(engine.fake)
        assert chat["messages"] == [
            {"role": "system", "content": "Be terse."},
            {"role": "user", "content": "Say hi to the proxy"},
        ]
        assert chat["stream"] is False
        assert chat["return_token_ids"] is True
        (call,) = await store.calls(rollout_id)
        assert (call.dialect, call.status, call.capture) == (
            CallDialect.RESPONSES,
            CallStatus.OK,
            Capture.TOKENS,
        )
        await assert_tokens(store, call.id, chat, "echo: Say hi to the proxy")
        assert response.usage is not None
        assert response.usage.input_tokens == call.prompt_tokens
        assert response.usage.output_tokens == call.completion_tokens
        bodies = await store.call_bodies(call.id)
        assert orjson.loads(bodies.engine_request or b"")["messages"] == chat["messages"]
        assert orjson.loads(bodies.response or b"") == response.model_dump(
            mode="json", exclude_unset=True
        )


def tool_script(body: dict[str, Any]) -> Reply:
    if body["messages"][-1]["role"] == "tool":
        return Reply(text="all done", reasoning="the listing came back")
    return Reply(
        text="I will list the files.",
        reasoning="I should look around first.",
        tool_calls=[{"name": "shell", "arguments": '{"cmd":   "ls -la"}'}],
    )


@pytest.mark.parametrize("stream", [False, True])
async def test_reasoning_text_and_tool_call(store: Store, sdk: OpenAIFactory, stream: bool) -> None:
    async with (
        fake_engine(FakeVLLM(script=tool_script)) as engine,
        running_proxy(store, engine.url) as proxy,
    ):
        rollout_id, key = await new_rollout(store)
        client = sdk(f"{proxy.url}/r/{key}/v1")
        kinds: list[str] = []
        if stream:
            async with client.responses.stream(
                model="m", input="look around", tools=[SHELL, WEB]
            ) as events:
                async for event in events:
                    kinds.append(event.type)
                response = await events.get_final_response()
        else:
            response = await client.responses.create(
                model="m", input="look around", tools=[SHELL, WEB]
            )

        reasoning, message, call = response.output
        assert reasoning.type == "reasoning"
        assert [c.text for c in reasoning.content or []] == ["I should look around first."]
        assert (reasoning.encrypted_content or "").startswith("rt1.")
        assert message.type == "message"
        assert response.output_text == "I will list the files."
        assert call.type == "function_call"
        assert (call.name, call.arguments) == ("shell", '{"cmd":   "ls -la"}')
        chat = engine_chat(engine.fake)
        (sent_tool,) = chat["tools"]  # web_search cannot run on a chat engine
        assert sent_tool["function"]["name"] == "shell"
        (rollout_call,) = await store.calls(rollout_id)
        assert call.call_id == f"call_{rollout_call.id}_0_0"  # the engine's own id
        raw = "<think>I should look around first.</think>I will list the files."
        raw += '<tool_call>{"name":"shell","arguments":{"cmd":"ls -la"}}</tool_call>'
        await assert_tokens(store, rollout_call.id, chat, raw)
        bodies = await store.call_bodies(rollout_call.id)
        recorded = orjson.loads(bodies.response or b"")
        assert recorded["output"] == [as_sent(item) for item in response.output]
        if stream:
            assert kinds[:2] == ["response.created", "response.in_progress"]
            assert kinds[-1] == "response.completed"
            assert kinds.count("response.output_item.added") == 3
            assert kinds.count("response.output_item.done") == 3
            assert "response.reasoning_text.delta" in kinds
            assert "response.output_text.delta" in kinds
            assert "response.function_call_arguments.done" in kinds
            assert rollout_call.stream
            assert rollout_call.first_token_at is not None


@pytest.mark.parametrize("stream", [False, True])
async def test_custom_and_namespaced_tools(store: Store, sdk: OpenAIFactory, stream: bool) -> None:
    patch = "*** Begin Patch\n*** Add File: a.txt\n+hi\n*** End Patch"

    def script(body: dict[str, Any]) -> Reply:
        return Reply(
            text="",
            tool_calls=[
                {"name": "apply_patch", "arguments": orjson.dumps({"input": patch}).decode()},
                {"name": "mcp__docs__search", "arguments": '{"q": "rolltap"}'},
            ],
        )

    async with (
        fake_engine(FakeVLLM(script=script)) as engine,
        running_proxy(store, engine.url) as proxy,
    ):
        _, key = await new_rollout(store)
        client = sdk(f"{proxy.url}/r/{key}/v1")
        tools: Any = [APPLY_PATCH, DOCS]
        if stream:
            async with client.responses.stream(model="m", input="edit", tools=tools) as events:
                response = await events.get_final_response()
        else:
            response = await client.responses.create(model="m", input="edit", tools=tools)

        custom, function = response.output
        assert (custom.type, custom.name, custom.input) == (
            "custom_tool_call",
            "apply_patch",
            patch,
        )
        assert function.type == "function_call"
        assert (function.name, function.namespace, function.arguments) == (
            "search",
            "mcp__docs__",
            '{"q": "rolltap"}',
        )
        sent = {t["function"]["name"]: t["function"] for t in engine_chat(engine.fake)["tools"]}
        assert set(sent) == {"apply_patch", "mcp__docs__search"}
        assert sent["apply_patch"]["parameters"]["required"] == ["input"]
        assert "start: patch" in sent["apply_patch"]["description"]


async def test_codex_request_shape(store: Store, sdk: OpenAIFactory) -> None:
    """What Codex 0.169 sends: no `instructions`, developer messages first, ids on input items,
    hosted and namespaced tools, `include`, `store: false`, `prompt_cache_key`,
    `client_metadata`."""
    body: Any = {
        "model": "m",
        "input": [
            {"type": "message", "id": "m1", "role": "developer", "content": [_text("Base.")]},
            {"type": "message", "id": "m2", "role": "developer", "content": [_text("Skills.")]},
            {"type": "message", "id": "m3", "role": "user", "content": [_text("<env/>")]},
            {"type": "message", "id": "m4", "role": "user", "content": [_text("Do it.")]},
            {
                "type": "function_call",
                "status": "completed",
                "id": "fc_1",
                "name": "exec_command",
                "arguments": '{"cmd": "ls"}',
                "call_id": "call_2",
            },
            {"type": "function_call_output", "id": "fco_1", "call_id": "call_2", "output": "a"},
            {"type": "message", "role": "developer", "content": [_text("Mid-turn note.")]},
        ],
        "tools": [{**SHELL, "name": "exec_command"}, DOCS, WEB],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "reasoning": {"summary": "auto"},
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "thread-1",
        "extra_body": {"client_metadata": {"session_id": "s", "turn_id": "t"}},
    }
    async with fake_engine() as engine, running_proxy(store, engine.url) as proxy:
        rollout_id, key = await new_rollout(store)
        client = sdk(f"{proxy.url}/r/{key}/v1")

        async with client.responses.stream(**body) as events:
            response = await events.get_final_response()

        chat = engine_chat(engine.fake)
        assert chat["messages"] == [
            {"role": "system", "content": "Base.\n\nSkills."},
            {"role": "user", "content": "<env/>"},
            {"role": "user", "content": "Do it."},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_2",
                        "type": "function",
                        "function": {"name": "exec_command", "arguments": '{"cmd": "ls"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_2", "content": "a"},
            {"role": "system", "content": "Mid-turn note."},
        ]
        assert [t["function"]["name"] for t in chat["tools"]] == [
            "exec_command",
            "mcp__docs__search",
        ]
        assert set(chat) - ENGINE_EXTRAS == {
            "model",
            "messages",
            "stream",
            "tools",
            "tool_choice",
            "parallel_tool_calls",
        }
        # With encrypted_content asked for, even an answer without reasoning carries a reference.
        carrier, message = response.output
        assert carrier.type == "reasoning"
        assert carrier.content == []
        assert (carrier.encrypted_content or "").startswith("rt1.")
        assert message.type == "message"
        (call,) = await store.calls(rollout_id)
        assert call.error is None


def _text(text: str) -> dict[str, str]:
    return {"type": "input_text", "text": text}


async def test_length_is_incomplete(store: Store, sdk: OpenAIFactory) -> None:
    async with fake_engine() as engine, running_proxy(store, engine.url) as proxy:
        rollout_id, key = await new_rollout(store)
        client = sdk(f"{proxy.url}/r/{key}/v1")

        kinds = []
        async with client.responses.stream(
            model="m", input="a long story please", max_output_tokens=5
        ) as events:
            async for event in events:
                kinds.append(event.type)
        response = await client.responses.create(
            model="m", input="a long story please", max_output_tokens=5
        )

        assert kinds[-1] == "response.incomplete"
        assert response.status == "incomplete"
        assert response.incomplete_details is not None
        assert response.incomplete_details.reason == "max_output_tokens"
        assert engine_chat(engine.fake)["max_tokens"] == 5
        assert all(c.finish_reason == "length" for c in await store.calls(rollout_id))


async def test_max_tokens_cap_is_applied_and_noted(store: Store, sdk: OpenAIFactory) -> None:
    async with (
        fake_engine() as engine,
        running_proxy(store, engine.url, max_tokens_cap=6) as proxy,
    ):
        rollout_id, key = await new_rollout(store)
        client = sdk(f"{proxy.url}/r/{key}/v1")

        capped = await client.responses.create(model="m", input="a long story please")
        own_limit = await client.responses.create(
            model="m", input="a long story please", max_output_tokens=4
        )

        # Cut by the proxy's cap: an ordinary end to the client, the truth in the record.
        assert capped.status == "completed"
        assert engine_chat(engine.fake, 0)["max_tokens"] == 6
        # Cut by the client's own, lower limit: incomplete, as usual.
        assert own_limit.status == "incomplete"
        assert engine_chat(engine.fake, 1)["max_tokens"] == 4
        first, second = await store.calls(rollout_id)
        assert (first.finish_reason, first.completion_tokens) == ("length", 6)
        assert first.error == (
            "no max_tokens lowered to 6 by the proxy's max_tokens_cap; "
            "cut at max_tokens_cap; the client was told the answer ended"
        )
        assert second.error is None


async def _post(url: str, data: bytes, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            url, data=data, headers={"Content-Type": "application/json", **(headers or {})}
        ) as resp,
    ):
        return resp.status, orjson.loads(await resp.read())


@pytest.mark.parametrize(
    ("body", "status", "param", "fragment"),
    [
        (b"{not json", 400, None, "not valid JSON"),
        (b'{"model": "m"}', 400, "input", "'input'"),
        (b'{"input": "hi", "stream": "yes"}', 400, "stream", "boolean"),
        (b'{"input": "hi", "max_output_tokens": 0}', 400, "max_output_tokens", "at least 1"),
        (b'{"input": [3]}', 400, "input", "input[0]"),
        (b'{"input": [{"type": "message", "content": "x"}]}', 400, "input", "input[0].role"),
        (b'{"input": [{"type": "function_call_output"}]}', 400, "input", "input[0].call_id"),
        (
            b'{"input": "hi", "previous_response_id": "resp_1"}',
            422,
            "previous_response_id",
            "whole",
        ),
        (b'{"input": [{"type": "item_reference", "id": "x"}]}', 422, "input", "item_reference"),
        (b'{"input": "hi", "tools": [{"type": "web_search"}], "tool_choice": "x"}', 200, None, ""),
    ],
)
async def test_bad_requests_get_openai_errors_and_are_recorded(
    store: Store, body: bytes, status: int, param: str | None, fragment: str
) -> None:
    async with fake_engine() as engine, running_proxy(store, engine.url) as proxy:
        rollout_id, key = await new_rollout(store)

        got, doc = await _post(f"{proxy.url}/r/{key}/v1/responses", body)

        assert got == status
        (call,) = await store.calls(rollout_id)
        assert call.dialect is CallDialect.RESPONSES
        if status == 200:
            # Hosted tools are left out; a tool_choice with no tools left goes with them.
            assert "tools" not in engine_chat(engine.fake)
            return
        assert set(doc) == {"error"}
        assert doc["error"]["param"] == param
        assert doc["error"]["type"] == "invalid_request_error"
        assert fragment in doc["error"]["message"]
        assert (call.status, call.http_status) == (CallStatus.REJECTED, status)
        assert engine.fake.requests == []


async def test_body_over_the_limit_is_413(store: Store) -> None:
    async with (
        fake_engine() as engine,
        running_proxy(store, engine.url, max_body_bytes=2048) as proxy,
    ):
        rollout_id, key = await new_rollout(store)
        body = orjson.dumps({"model": "m", "input": "x" * 4096})

        got, doc = await _post(f"{proxy.url}/r/{key}/v1/responses", body)

        assert got == 413
        assert doc["error"]["code"] == "request_too_large"
        (call,) = await store.calls(rollout_id)
        assert (call.dialect, call.status) == (CallDialect.RESPONSES, CallStatus.REJECTED)


async def test_engine_refusal_in_openai_shape(store: Store) -> None:
    message = "This model's maximum context length is 32 tokens. However, you asked for 90."
    fake = FakeVLLM(script=lambda body: Reply(fault=Status(400, message)))
    async with fake_engine(fake) as engine, running_proxy(store, engine.url) as proxy:
        rollout_id, key = await new_rollout(store)

        got, doc = await _post(
            f"{proxy.url}/r/{key}/v1/responses",
            orjson.dumps({"model": "m", "input": "hi", "stream": True}),
        )

        assert got == 400
        # The code Codex reads as "context window exceeded" (and compacts on).
        assert doc["error"] == {
            "message": message,
            "type": "invalid_request_error",
            "param": None,
            "code": "context_length_exceeded",
        }
        (call,) = await store.calls(rollout_id)
        assert (call.status, call.http_status) == (CallStatus.FAILED, 400)


async def test_engine_failing_mid_stream_sends_response_failed(store: Store) -> None:
    fake = FakeVLLM(script=lambda body: Reply(text="one two three four", fault=DieAfter(8)))
    async with fake_engine(fake) as engine, running_proxy(store, engine.url) as proxy:
        rollout_id, key = await new_rollout(store)
        events: list[dict[str, Any]] = []
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                f"{proxy.url}/r/{key}/v1/responses",
                json={"model": "m", "input": "count to ten", "stream": True},
            ) as resp,
        ):
            assert resp.status == 200
            text = (await resp.read()).decode()
        for frame in text.strip().split("\n\n"):
            name, data = frame.split("\n", 1)
            events.append({"event": name[len("event: ") :], **orjson.loads(data[len("data: ") :])})

        assert all(e["event"] == e["type"] for e in events)
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        assert events[0]["type"] == "response.created"
        assert events[-1]["type"] == "response.failed"
        assert events[-1]["response"]["status"] == "failed"
        assert events[-1]["response"]["error"]["code"] == "server_error"
        (call,) = await store.calls(rollout_id)
        assert (call.status, call.http_status) == (CallStatus.FAILED, 502)
        # What the engine sampled before it died is kept.
        assert call.completion_tokens == 7  # the role chunk, then one token per chunk


async def test_retry_is_linked_and_side_calls_are_named(store: Store, sdk: OpenAIFactory) -> None:
    async with fake_engine() as engine, running_proxy(store, engine.url) as proxy:
        rollout_id, key = await new_rollout(store)
        client = sdk(f"{proxy.url}/r/{key}/v1")

        await client.responses.create(model="m", input="summarise", extra_headers={})
        await client.responses.create(
            model="m", input="summarise", extra_headers={"x-stainless-retry-count": "1"}
        )
        await client.responses.create(
            model="m", input="compact this", extra_headers={"x-openai-subagent": "compact"}
        )

        first, retry, side = await store.calls(rollout_id)
        assert retry.retry_of == first.id
        assert retry.retry_count == 1
        assert first.retry_of is None
        assert side.purpose == "compact"


async def test_multi_turn_rollout_is_one_trajectory(store: Store, sdk: OpenAIFactory) -> None:
    """The store reads Responses bodies like chat ones: a clean rollout is one segment."""
    async with fake_engine() as engine, running_proxy(store, engine.url) as proxy:
        rollout_id, key = await new_rollout(store)
        client = sdk(f"{proxy.url}/r/{key}/v1")
        history: list[Any] = [{"role": "user", "content": "turn 0"}]
        for turn in range(1, 4):
            response = await client.responses.create(
                model="m", input=history, include=["reasoning.encrypted_content"]
            )
            history += [item.model_dump(exclude_none=True) for item in response.output]
            history.append({"role": "user", "content": f"turn {turn}"})

        built = await rollout_trajectories(store, rollout_id)
        (trajectory,) = built.trajectories
        assert built.faithfulness.share == 1.0
        calls = await store.calls(rollout_id)
        last = await store.call_tokens(calls[-1].id)
        full = trajectory.prompt_ids.tolist() + trajectory.response_ids.tolist()
        assert full == last.prompt_ids.tolist() + last.choices[0].token_ids.tolist()
        bodies = await store.call_bodies(calls[-1].id)
        # The empty reasoning item carrying the reference is nothing a template renders.
        assert response_turns(CallDialect.RESPONSES, bodies.response) == [
            ConversationTurn("assistant", "echo: turn 2")
        ]
        assert request_turns(CallDialect.RESPONSES, bodies.request) == [
            ConversationTurn("user", "turn 0"),
            ConversationTurn("assistant", "echo: turn 0"),
            ConversationTurn("user", "turn 1"),
            ConversationTurn("assistant", "echo: turn 1"),
            ConversationTurn("user", "turn 2"),
        ]
