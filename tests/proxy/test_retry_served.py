"""A harness's retry is not a new sample: an SDK retry (x-stainless-retry-count > 0) of a call
still being sampled, or answered moments ago, gets that call's answer, token for token, recorded
as a retry of it; the engine draws nothing new. A retry of a failed call, and an equal body
without the retry header, are sampled anew."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import aiohttp
import orjson

from rolltap.store import CallStatus, Store
from tests.support.fake_vllm import FakeVLLM, Reply, Status
from tests.support.proxy import fake_engine, running_proxy

BODY = {"model": "m", "messages": [{"role": "user", "content": "run the tests"}]}


def _drawing_script(delay: float = 0.0, fail_first: bool = False) -> Any:
    draws = itertools.count(1)

    def script(body: dict[str, Any]) -> Reply:
        n = next(draws)
        fault = Status(500, "engine fell over") if fail_first and n == 1 else None
        return Reply(text=f"draw number {n}", token_delay=delay, fault=fault)

    return script


async def _ask(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], retry: int = 0
) -> tuple[int, bytes]:
    headers = {"x-stainless-retry-count": str(retry)}
    async with session.post(url, data=orjson.dumps(body), headers=headers) as resp:
        return resp.status, await resp.read()


def _streamed_text(raw: bytes) -> str:
    """The content of a chat completion stream's chunks."""
    docs = [orjson.loads(line[6:]) for line in raw.splitlines() if line.startswith(b"data: {")]
    return "".join(c["delta"].get("content") or "" for d in docs for c in d["choices"])


def _content(raw: bytes) -> str:
    return str(orjson.loads(raw)["choices"][0]["message"]["content"])


async def test_a_retry_of_an_answered_call_gets_its_answer_not_a_new_draw(store: Store) -> None:
    fake = FakeVLLM(script=_drawing_script())
    async with fake_engine(fake) as engine, running_proxy(store, engine.url) as proxy:
        created = await store.create_rollout()
        url = f"{proxy.url}/r/{created.key}/v1/chat/completions"
        async with aiohttp.ClientSession() as session:
            first = await _ask(session, url, BODY)
            retried = await _ask(session, url, BODY, retry=1)
            streamed = await _ask(session, url, {**BODY, "stream": True})
            streamed_retry = await _ask(session, url, {**BODY, "stream": True}, retry=2)
            again = await _ask(session, url, BODY)  # no retry header: a new sample

    assert (first[0], retried[0]) == (200, 200)
    assert _content(first[1]) == _content(retried[1]) == "draw number 1"
    assert _streamed_text(streamed[1]) == _streamed_text(streamed_retry[1]) == "draw number 2"
    assert _content(again[1]) == "draw number 3"
    assert fake.served == 3, "the retries drew nothing"
    calls = sorted(await store.calls(created.id), key=lambda c: c.seq)
    assert [c.status for c in calls] == [CallStatus.OK] * 5
    assert [c.retry_of for c in calls] == [None, calls[0].id, None, calls[2].id, None]
    assert "served its answer, not a new draw" in (calls[1].error or "")
    tokens = [await store.call_tokens(c.id) for c in calls[:2]]
    assert tokens[0].prompt_ids.tolist() == tokens[1].prompt_ids.tolist()
    assert tokens[0].choices[0].token_ids.tolist() == tokens[1].choices[0].token_ids.tolist()
    assert tokens[0].choices[0].logprobs.tolist() == tokens[1].choices[0].logprobs.tolist()


async def test_a_retry_while_its_call_is_sampled_waits_for_that_answer(store: Store) -> None:
    fake = FakeVLLM(script=_drawing_script(delay=0.02))
    async with fake_engine(fake) as engine, running_proxy(store, engine.url) as proxy:
        created = await store.create_rollout()
        url = f"{proxy.url}/r/{created.key}/v1/chat/completions"
        async with aiohttp.ClientSession() as session:
            first = asyncio.create_task(_ask(session, url, BODY))
            while fake.served == 0:
                await asyncio.sleep(0.01)
            retried = await _ask(session, url, BODY, retry=1)
            assert first.done(), "the retry answered once its call was recorded"
            answered = await first
    assert _content(retried[1]) == _content(answered[1]) == "draw number 1"
    assert fake.served == 1
    calls = sorted(await store.calls(created.id), key=lambda c: c.seq)
    assert calls[1].retry_of == calls[0].id


async def test_a_retry_of_a_failed_call_is_sampled_anew(store: Store) -> None:
    fake = FakeVLLM(script=_drawing_script(fail_first=True))
    async with fake_engine(fake) as engine, running_proxy(store, engine.url) as proxy:
        created = await store.create_rollout()
        url = f"{proxy.url}/r/{created.key}/v1/chat/completions"
        async with aiohttp.ClientSession() as session:
            failed = await _ask(session, url, BODY)
            retried = await _ask(session, url, BODY, retry=1)
    assert failed[0] == 500
    assert _content(retried[1]) == "draw number 2"
    assert fake.served == 2
