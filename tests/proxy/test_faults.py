"""Bad input gets an OpenAI-style error and a rejected record; faults leave the store consistent."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import aiohttp
import openai
import orjson
import pytest

from rolltap.store import CallStatus, Capture, Store
from rolltap.store.events import Declared
from tests.support.fake_vllm import IM_END, DieAfter, FakeVLLM, Reply, Status, encode, render
from tests.support.proxy import OpenAIFactory, fake_engine, new_rollout, running_proxy

MESSAGES = [{"role": "user", "content": "count to ten slowly"}]


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
        (b"[1, 2]", 400, None, "JSON object"),
        (b'{"model": "m"}', 400, "messages", "non-empty array"),
        (b'{"model": "m", "messages": []}', 400, "messages", "non-empty array"),
        (b'{"model": "m", "messages": ["hi"]}', 400, "messages", "messages[0]"),
        (b'{"model": 7, "messages": [{"role": "user", "content": "x"}]}', 400, "model", "string"),
        (b'{"messages": [{"role": "user"}], "stream": "yes"}', 400, "stream", "boolean"),
        (b'{"messages": [{"role": "user"}], "n": true}', 400, "n", "integer"),
        (b'{"messages": [{"role": "user"}], "n": 0}', 400, "n", "between"),
        (b'{"messages": [{"role": "user"}], "max_tokens": 0}', 400, "max_tokens", "at least"),
        (b'{"messages": [{"role": "user"}], "temperature": "hot"}', 400, "temperature", "number"),
        (b'{"messages": [{"role": "user"}], "tools": {"a": 1}}', 400, "tools", "array"),
        (b'{"messages": [{"role": "user"}], "functions": []}', 422, "functions", "tools"),
        (b'{"messages": [{"role": "user"}], "modalities": ["audio"]}', 422, "modalities", "audio"),
    ],
)
async def test_bad_requests_are_refused_recorded_and_survived(
    store: Store, body: bytes, status: int, param: str | None, fragment: str
) -> None:
    async with fake_engine() as engine, running_proxy(store, engine.url) as proxy:
        rollout_id, key = await new_rollout(store)
        url = f"{proxy.url}/r/{key}/v1/chat/completions"

        got, error = await _post(url, body)

        assert got == status
        assert set(error) == {"error"}
        assert set(error["error"]) == {"message", "type", "param", "code"}
        assert error["error"]["type"] == "invalid_request_error"
        assert error["error"]["param"] == param
        assert fragment in error["error"]["message"]
        assert engine.fake.requests == []
        (call,) = await store.calls(rollout_id)
        assert (call.status, call.http_status, call.capture) == (
            CallStatus.REJECTED,
            status,
            Capture.NONE,
        )
        # The proxy stays up and serves the next, good request.
        ok, _ = await _post(url, orjson.dumps({"model": "m", "messages": MESSAGES}))
        assert ok == 200


async def test_body_over_the_limit_is_413(store: Store) -> None:
    async with (
        fake_engine() as engine,
        running_proxy(store, engine.url, max_body_bytes=4096) as proxy,
    ):
        rollout_id, key = await new_rollout(store)
        big = orjson.dumps({"messages": [{"role": "user", "content": "x" * 10_000}]})

        status, error = await _post(f"{proxy.url}/r/{key}/v1/chat/completions", big)

        assert status == 413
        assert "limit of 4096 bytes" in error["error"]["message"]
        (call,) = await store.calls(rollout_id)
        assert call.status is CallStatus.REJECTED
        assert call.http_status == 413


@pytest.mark.parametrize(
    "path", ["/r/{key}/v1/embeddings", "/v1/nothing/here", "/r/{key}/v2/chat/completions"]
)
async def test_unknown_paths_are_404_in_openai_format_without_the_key(
    store: Store, path: str
) -> None:
    async with fake_engine() as engine, running_proxy(store, engine.url) as proxy:
        _, key = await new_rollout(store)
        status, error = await _post(proxy.url + path.format(key=key), b"{}")

        assert status == 404
        assert error["error"]["type"] == "not_found_error"
        assert key not in error["error"]["message"]


async def test_engine_refusal_passes_through_as_the_engine_said(store: Store) -> None:
    def script(body: dict[str, Any]) -> Reply:
        return Reply(fault=Status(400))

    async with (
        fake_engine(FakeVLLM(script=script)) as engine,
        running_proxy(store, engine.url) as proxy,
    ):
        rollout_id, key = await new_rollout(store)
        status, error = await _post(
            f"{proxy.url}/r/{key}/v1/chat/completions", orjson.dumps({"messages": MESSAGES})
        )

        assert status == 400
        assert error == {
            "error": {"message": "fake failure", "type": "InternalServerError", "code": 400}
        }
        (call,) = await store.calls(rollout_id)
        assert (call.status, call.http_status, call.error) == (
            CallStatus.FAILED,
            400,
            "fake failure",
        )


async def test_backend_dying_mid_stream_sends_an_error_event_and_keeps_partial_tokens(
    store: Store, sdk: OpenAIFactory
) -> None:
    text = "0123456789" * 3

    def script(body: dict[str, Any]) -> Reply:
        return Reply(text=text, fault=DieAfter(12))

    async with (
        fake_engine(FakeVLLM(script=script)) as engine,
        running_proxy(store, engine.url) as proxy,
    ):
        rollout_id, key = await new_rollout(store)
        client = sdk(f"{proxy.url}/r/{key}/v1", max_retries=0)
        seen = ""
        with pytest.raises(openai.APIError, match="failed mid-stream"):
            async for chunk in await client.chat.completions.create(
                model="m", messages=MESSAGES, stream=True
            ):
                seen += chunk.choices[0].delta.content or ""

        # 12 chunks went out: the role chunk, then 11 tokens.
        assert seen == text[:11]
        (call,) = await store.calls(rollout_id)
        assert call.status is CallStatus.FAILED
        assert call.http_status == 502
        tokens = await store.call_tokens(call.id)
        assert tokens.prompt_ids.tolist() == render(MESSAGES, None)
        assert tokens.choices[0].token_ids.tolist() == encode(text)[:11]


async def test_client_disconnect_cancels_the_engine_request_and_records_it(
    store: Store,
) -> None:
    def script(body: dict[str, Any]) -> Reply:
        return Reply(text="x" * 400, token_delay=0.01)

    fake = FakeVLLM(script=script)
    async with fake_engine(fake) as engine, running_proxy(store, engine.url) as proxy:
        rollout_id, key = await new_rollout(store)
        body = orjson.dumps({"messages": MESSAGES, "stream": True})
        async with aiohttp.ClientSession() as session:
            resp = await session.post(f"{proxy.url}/r/{key}/v1/chat/completions", data=body)
            received = b""
            while received.count(b"data:") < 6:
                received += await resp.content.readany()
            resp.close()  # the client goes away mid-stream

        for _ in range(100):
            calls = await store.calls(rollout_id)
            if calls:
                break
            await asyncio.sleep(0.05)
        (call,) = calls
        assert call.status is CallStatus.CANCELLED
        tokens = await store.call_tokens(call.id)
        sampled = tokens.choices[0].token_ids.tolist()
        assert 5 <= len(sampled) < 400
        assert sampled == encode("x" * len(sampled))
        # The engine saw its client go away: generation stopped there, not after 400 tokens.
        for _ in range(100):
            if engine.fake.disconnects:
                break
            await asyncio.sleep(0.05)
        assert engine.fake.disconnects == 1


async def test_unknown_key_is_401_and_never_attributed(store: Store, sdk: OpenAIFactory) -> None:
    async with fake_engine() as engine, running_proxy(store, engine.url) as proxy:
        rollout_id, _ = await new_rollout(store)
        client = sdk(f"{proxy.url}/r/rk-nobody/v1", max_retries=0)

        with pytest.raises(openai.AuthenticationError) as caught:
            await client.chat.completions.create(model="m", messages=MESSAGES)

        assert caught.value.status_code == 401
        assert caught.value.code == "invalid_api_key"
        assert "rk-nobody" not in str(caught.value)
        assert await store.calls(rollout_id) == []
        assert engine.fake.requests == []


async def test_finished_rollout_takes_no_more_calls(store: Store, sdk: OpenAIFactory) -> None:
    async with fake_engine() as engine, running_proxy(store, engine.url) as proxy:
        rollout_id, key = await new_rollout(store)
        await store.report(rollout_id, Declared("finished"))
        client = sdk(f"{proxy.url}/r/{key}/v1", max_retries=0)

        with pytest.raises(openai.PermissionDeniedError, match="takes no more calls"):
            await client.chat.completions.create(model="m", messages=MESSAGES)

        (call,) = await store.calls(rollout_id)
        assert call.status is CallStatus.REJECTED


async def test_call_budget_ends_the_rollout_with_its_own_status(
    store: Store, sdk: OpenAIFactory
) -> None:
    async with fake_engine() as engine, running_proxy(store, engine.url) as proxy:
        rollout_id, key = await new_rollout(store, max_calls=2)
        client = sdk(f"{proxy.url}/r/{key}/v1", max_retries=0)
        for _ in range(2):
            await client.chat.completions.create(model="m", messages=MESSAGES)

        with pytest.raises(openai.PermissionDeniedError) as caught:
            await client.chat.completions.create(model="m", messages=MESSAGES)

        assert caught.value.code == "rollout_budget_exceeded"
        rollout = await store.rollout(rollout_id)
        assert rollout.status.value == "budget_exceeded"
        assert [c.status for c in await store.calls(rollout_id)] == [
            CallStatus.OK,
            CallStatus.OK,
            CallStatus.REJECTED,
        ]
        assert len(engine.fake.requests) == 2


async def test_token_budget(store: Store, sdk: OpenAIFactory) -> None:
    async with fake_engine() as engine, running_proxy(store, engine.url) as proxy:
        prompt = len(render(MESSAGES, None))
        rollout_id, key = await new_rollout(store, max_tokens=prompt + 5)
        client = sdk(f"{proxy.url}/r/{key}/v1", max_retries=0)
        await client.chat.completions.create(model="m", messages=MESSAGES)

        with pytest.raises(openai.PermissionDeniedError, match="tokens"):
            await client.chat.completions.create(model="m", messages=MESSAGES)

        assert (await store.rollout(rollout_id)).status.value == "budget_exceeded"


async def test_sdk_retry_is_linked_to_the_call_it_repeats(store: Store, sdk: OpenAIFactory) -> None:
    attempts = 0

    def script(body: dict[str, Any]) -> Reply:
        nonlocal attempts
        attempts += 1
        return Reply(text="finally", fault=Status(500) if attempts == 1 else None)

    async with (
        fake_engine(FakeVLLM(script=script)) as engine,
        running_proxy(store, engine.url) as proxy,
    ):
        rollout_id, key = await new_rollout(store)
        client = sdk(f"{proxy.url}/r/{key}/v1", max_retries=2)

        reply = await client.chat.completions.create(model="m", messages=MESSAGES)

        assert reply.choices[0].message.content == "finally"
        first, second = await store.calls(rollout_id)
        assert (first.status, first.http_status) == (CallStatus.FAILED, 500)
        assert second.status is CallStatus.OK
        assert second.retry_count == 1
        assert second.retry_of == first.id
        assert first.body_hash == second.body_hash


async def test_resampling_the_same_prompt_is_not_a_retry(store: Store, sdk: OpenAIFactory) -> None:
    async with fake_engine() as engine, running_proxy(store, engine.url) as proxy:
        rollout_id, key = await new_rollout(store)
        client = sdk(f"{proxy.url}/r/{key}/v1")
        for _ in range(2):
            await client.chat.completions.create(model="m", messages=MESSAGES)

        first, second = await store.calls(rollout_id)
        assert first.body_hash == second.body_hash
        assert second.retry_of is None


async def test_prompt_of_a_later_turn_is_delta_encoded(store: Store, sdk: OpenAIFactory) -> None:
    async with fake_engine() as engine, running_proxy(store, engine.url) as proxy:
        rollout_id, key = await new_rollout(store)
        client = sdk(f"{proxy.url}/r/{key}/v1")
        history: list[Any] = list(MESSAGES)
        for turn in range(3):
            reply = await client.chat.completions.create(model="m", messages=history)
            history += [
                {"role": "assistant", "content": reply.choices[0].message.content},
                {"role": "user", "content": f"and again {turn}"},
            ]

        tokens = list((await store.rollout_tokens(rollout_id)).values())
        assert tokens[2].prompt_ids.tolist() == render(history[:-2], None)
        # Each turn's prompt starts with the previous prompt + exactly the ids it sampled.
        for earlier, later in itertools.pairwise(tokens):
            head = earlier.prompt_ids.tolist() + earlier.choices[0].token_ids.tolist()
            assert head[-1] == IM_END
            assert later.prompt_ids.tolist()[: len(head)] == head
