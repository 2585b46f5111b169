"""Weight updates in abort_resume mode, through the real proxy and a fake vLLM engine: the engine
ends the running answers at once, the proxy records each partial answer as a call of its own
(old version), continues it token-in after the commit (new version, linked), and the client gets
one uninterrupted answer, streaming or not, in every dialect."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from rolltap.analysis.reading import rollout_trajectories
from rolltap.analysis.steps import TurnKind
from rolltap.audit.integrity import verify_rollout
from rolltap.store import CallDialect, CallStatus, Store
from tests.support.fake_vllm import FakeVLLM, Reply, encode
from tests.support.proxy import OpenAIFactory, fake_engine, running_proxy
from tests.support.waiting import until

ANSWER = "the quick brown fox jumps over the lazy dog, again and again"
MESSAGES = [{"role": "user", "content": "tell me about the fox"}]


def _slow() -> FakeVLLM:
    return FakeVLLM(script=lambda body: Reply(text=ANSWER), token_delay=0.02)


async def _post(session: aiohttp.ClientSession, url: str, body: Any) -> Any:
    async with session.post(url, json=body) as resp:
        data = await resp.json()
        assert resp.status == 200, data
        return data


async def _update_mid_answer(proxy_url: str, fake: FakeVLLM, version: str) -> dict[str, Any]:
    """Wait until the engine is some tokens into the answer, then begin and commit an
    abort_resume update; returns what begin answered."""
    await until(lambda: len(fake.requests) == 1)
    await asyncio.sleep(0.2)  # a few tokens sampled, most still to come
    async with aiohttp.ClientSession() as session:
        began = await _post(
            session, f"{proxy_url}/v1/weights/begin", {"mode": "abort_resume", "timeout": 10}
        )
        await asyncio.sleep(0.1)
        await _post(session, f"{proxy_url}/v1/weights/commit", {"version": version})
    return dict(began)


async def _two_calls(store: Store, rollout_id: str) -> tuple[Any, Any]:
    first, second = sorted(await store.calls(rollout_id), key=lambda c: c.seq)
    assert first.status is CallStatus.OK
    assert second.status is CallStatus.OK
    assert (first.weight_version, second.weight_version) == ("1", "2")
    assert first.finish_reason == "abort"
    assert second.finish_reason == "stop"
    assert second.resumes == first.id
    assert first.resumes is None
    # The resume link is part of the hash chain: the stored record verifies with it.
    assert (await verify_rollout(store, rollout_id)).issues == ()
    tokens = {c.id: await store.call_tokens(c.id) for c in (first, second)}
    one, two = tokens[first.id], tokens[second.id]
    partial = list(one.choices[0].token_ids)
    assert 0 < len(partial) < len(encode(ANSWER))
    # The continuation was sampled token-in: its prompt is the first prompt plus the partial.
    assert list(two.prompt_ids) == list(one.prompt_ids) + partial
    assert partial + list(two.choices[0].token_ids) == [*encode(ANSWER), 2]
    return first, second


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_an_answer_aborted_by_an_update_is_resumed_as_one_answer(
    store: Store, sdk: OpenAIFactory, stream: bool
) -> None:
    fake = _slow()
    async with (
        fake_engine(fake) as engine,
        running_proxy(store, engine.url, weight_version="1") as proxy,
    ):
        created = await store.create_rollout()
        client = sdk(f"{proxy.url}/r/{created.key}/v1", max_retries=0)

        async def ask() -> tuple[str, str | None, Any]:
            if not stream:
                answer = await client.chat.completions.create(
                    model="m", messages=MESSAGES, logprobs=True
                )
                choice = answer.choices[0]
                return choice.message.content or "", choice.finish_reason, answer.usage
            parts, finishes, usage = [], [], None
            chunks = await client.chat.completions.create(
                model="m", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
            )
            async for chunk in chunks:
                for choice in chunk.choices:
                    parts.append(choice.delta.content or "")
                    if choice.finish_reason:
                        finishes.append(choice.finish_reason)
                usage = chunk.usage or usage
            assert len(finishes) == 1
            return "".join(parts), finishes[0], usage

        asking = asyncio.create_task(ask())
        began = await _update_mid_answer(proxy.url, fake, "2")
        text, finish, usage = await asking

    assert began["drained"] is True
    # vLLM's own abort: /pause?mode=abort, which ends running requests and answers once idle.
    assert began["aborted"] == [
        {"backend": engine.url, "ok": True, "detail": "POST /pause?mode=abort: paused"}
    ]
    assert text == ANSWER
    assert finish == "stop"
    first, second = await _two_calls(store, created.id)
    assert usage.completion_tokens == first.completion_tokens + second.completion_tokens
    assert usage.prompt_tokens == first.prompt_tokens
    assert second.dialect is CallDialect.CHAT
    assert "continues" in (second.error or "")
    (trajectory,) = (await rollout_trajectories(store, created.id)).trajectories
    assert list(trajectory.call_ids) == [first.id, second.id]
    assert [(t.kind, t.weight_version) for t in trajectory.turns] == [
        (TurnKind.ANSWER, "1"),
        (TurnKind.ANSWER, "2"),
    ]
    assert (trajectory.min_version, trajectory.max_version) == ("1", "2")
    assert (trajectory.loss_mask == 1).all()
    # What the engine was asked to continue with: the completions route, token-in.
    path, _, continuation = fake.requests[-1]
    assert path == "/v1/completions"
    assert continuation["prompt"][-first.completion_tokens :] == [
        *encode(ANSWER)[: first.completion_tokens]
    ]


async def test_a_messages_client_gets_one_uninterrupted_answer(store: Store) -> None:
    fake = _slow()
    async with (
        fake_engine(fake) as engine,
        running_proxy(store, engine.url, weight_version="1") as proxy,
    ):
        created = await store.create_rollout()
        body = {
            "model": "m",
            "max_tokens": 200,
            "stream": True,
            "messages": [{"role": "user", "content": "tell me about the fox"}],
        }

        async def ask() -> list[dict[str, Any]]:
            events = []
            async with aiohttp.ClientSession() as session:
                async with session.post(
                    f"{proxy.url}/r/{created.key}/v1/messages", json=body
                ) as resp:
                    assert resp.status == 200
                    async for line in resp.content:
                        if line.startswith(b"data: "):
                            import json

                            events.append(json.loads(line[6:]))
            return events

        asking = asyncio.create_task(ask())
        await _update_mid_answer(proxy.url, fake, "2")
        events = await asking

    text = "".join(
        e["delta"].get("text", "") for e in events if e.get("type") == "content_block_delta"
    )
    stops = [e for e in events if e.get("type") == "message_delta"]
    assert text == ANSWER
    assert [e["delta"]["stop_reason"] for e in stops] == ["end_turn"]
    assert events[-1]["type"] == "message_stop"
    first, second = await _two_calls(store, created.id)
    assert {first.dialect, second.dialect} == {CallDialect.MESSAGES}


async def test_calls_dispatched_during_the_update_wait_and_are_not_aborted(
    store: Store, sdk: OpenAIFactory
) -> None:
    fake = _slow()
    async with (
        fake_engine(fake) as engine,
        running_proxy(store, engine.url, weight_version="1") as proxy,
    ):
        created = await store.create_rollout()
        client = sdk(f"{proxy.url}/r/{created.key}/v1", max_retries=0)
        async with aiohttp.ClientSession() as session:
            await _post(session, f"{proxy.url}/v1/weights/begin", {"mode": "abort_resume"})
            held = asyncio.create_task(client.chat.completions.create(model="m", messages=MESSAGES))
            await until(lambda: proxy.ctx.hold.waiting == 1)
            await _post(session, f"{proxy.url}/v1/weights/commit", {"version": "2"})
        answer = await held

    assert answer.choices[0].message.content == ANSWER
    (call,) = await store.calls(created.id)
    assert (call.weight_version, call.finish_reason, call.resumes) == ("2", "stop", None)


async def test_an_abort_outside_an_update_reaches_the_client_as_it_is(
    store: Store, sdk: OpenAIFactory
) -> None:
    fake = _slow()
    async with (
        fake_engine(fake) as engine,
        running_proxy(store, engine.url, weight_version="1") as proxy,
    ):
        created = await store.create_rollout()
        client = sdk(f"{proxy.url}/r/{created.key}/v1", max_retries=0)
        asking = asyncio.create_task(client.chat.completions.create(model="m", messages=MESSAGES))
        await until(lambda: len(fake.requests) == 1)
        await asyncio.sleep(0.2)
        async with aiohttp.ClientSession() as session:
            await _post(session, f"{engine.url}/abort_requests", {})
        answer = await asking

    assert answer.choices[0].finish_reason == "abort"
    assert 0 < len(answer.choices[0].message.content or "") < len(ANSWER)
    (call,) = await store.calls(created.id)
    assert (call.finish_reason, call.resumes, call.weight_version) == ("abort", None, "1")
