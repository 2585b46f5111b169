"""The relay (proxy/upstream/relay.py) in every dialect: a broken or malformed answer ends in the
client's
own error shape and is recorded with what was received; a stream ends only once its record is
durable; a client that leaves stops the engine and is recorded as cancelled."""

from __future__ import annotations

import asyncio
import sqlite3
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
import pytest

from rolltap.engine.launch import EngineProcess
from rolltap.proxy.server import RunningProxy
from rolltap.store import CallStatus, CallView, Capture, Store
from tests.support.engine import engine_stats, wait_until_idle
from tests.support.fake_vllm import (
    BadIds,
    ErrorEvent,
    FakeVLLM,
    Fault,
    Garble,
    NoLogprob,
    Reply,
    encode,
)
from tests.support.proxy import fake_engine, new_rollout, running_proxy
from tests.support.waiting import until

TEXT = "one two three four"
USER = {"role": "user", "content": "count"}


@dataclass(frozen=True)
class Dialect:
    name: str
    path: str
    body: dict[str, Any]

    def request(self, stream: bool) -> dict[str, Any]:
        return {**self.body, "stream": stream}


DIALECTS = [
    Dialect("chat", "/v1/chat/completions", {"model": "m", "messages": [USER]}),
    Dialect("responses", "/v1/responses", {"model": "m", "input": "count"}),
    Dialect("messages", "/v1/messages", {"model": "m", "max_tokens": 100, "messages": [USER]}),
]


def frames(body: bytes) -> list[tuple[str | None, Any]]:
    """An event stream as (event name, data) pairs; it must parse to the last byte."""
    out: list[tuple[str | None, Any]] = []
    assert body.endswith(b"\n\n"), body[-200:]
    for event in body.decode().split("\n\n")[:-1]:
        name = None
        data = []
        for line in event.split("\n"):
            field, _, value = line.partition(": ")
            assert field in ("event", "data"), line
            if field == "event":
                name = value
            else:
                data.append(value)
        joined = "\n".join(data)
        out.append((name, joined if joined == "[DONE]" else orjson.loads(joined)))
    return out


def ended_with_error(dialect: str, events: list[tuple[str | None, Any]]) -> bool:
    name, data = events[-1]
    if dialect == "chat":
        return isinstance(data, dict) and data.get("error", {}).get("type") == "upstream_error"
    if dialect == "responses":
        return name == "response.failed" and data["response"]["status"] == "failed"
    return name == "error" and data["error"]["type"] == "api_error"


def saw_an_ending(dialect: str, events: list[tuple[str | None, Any]]) -> bool:
    """Whether anything that tells a client the answer is complete went out."""
    for name, data in events:
        if dialect == "chat" and (
            data == "[DONE]"
            or any(c.get("finish_reason") for c in (data.get("choices") or ()))
            or data.get("usage")
        ):
            return True
        if name in ("response.completed", "response.incomplete", "message_delta", "message_stop"):
            return True
    return False


async def post(url: str, body: dict[str, Any]) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as resp:
        return resp.status, await resp.read()


async def only_call(store: Store, rollout_id: str) -> CallView:
    """The rollout's one call, once its record landed (a cancelled one lands after the reply)."""
    for _ in range(200):
        calls = await store.calls(rollout_id)
        if calls:
            (call,) = calls
            return call
        await asyncio.sleep(0.05)
    raise AssertionError("the call was never recorded")


@pytest.mark.parametrize("dialect", DIALECTS, ids=lambda d: d.name)
@pytest.mark.parametrize("fault", [Garble(5), NoLogprob(5), ErrorEvent(5)], ids=lambda f: f.spec)
async def test_a_malformed_stream_ends_in_the_dialects_error_event(
    store: Store, dialect: Dialect, fault: Fault
) -> None:
    fake = FakeVLLM(script=lambda body: Reply(text=TEXT, fault=fault))
    async with fake_engine(fake) as engine, running_proxy(store, engine.url) as proxy:
        rollout_id, key = await new_rollout(store)

        status, body = await post(f"{proxy.url}/r/{key}{dialect.path}", dialect.request(True))

        assert status == 200
        events = frames(body)  # a well-formed stream to its end: no 500 written into it
        assert ended_with_error(dialect.name, events)
        assert not saw_an_ending(dialect.name, events)
        call = await only_call(store, rollout_id)
        assert (call.status, call.http_status) == (CallStatus.FAILED, 502)
        tokens = await store.call_tokens(call.id)
        # Chunks 1-4 carried one token each; a chunk that could be read keeps its ids too.
        sampled = tokens.choices[0].token_ids.tolist()
        assert sampled == encode(TEXT)[: len(sampled)]
        assert len(sampled) == (5 if isinstance(fault, NoLogprob) else 4)
        response = (await store.call_bodies(call.id)).response
        assert response is not None
        sent = fake.requests[0][1]["X-Request-Id"]
        if isinstance(fault, Garble):
            # The bytes that could not be read are kept as they came.
            assert response.startswith(b'{"id":"chatcmpl-' + sent.encode())
            with pytest.raises(orjson.JSONDecodeError):
                orjson.loads(response)
        elif isinstance(fault, NoLogprob):
            assert b'"token_ids":[' in response
            assert "KeyError" in (call.error or "")
        else:
            assert "fake failure mid-stream" in (call.error or "")
        # The proxy is still up and serves the next call of the rollout.
        fake.script = lambda body: Reply(text="fine")
        status, body = await post(f"{proxy.url}/r/{key}{dialect.path}", dialect.request(True))
        assert status == 200
        assert not ended_with_error(dialect.name, frames(body))


@pytest.mark.parametrize("dialect", DIALECTS, ids=lambda d: d.name)
@pytest.mark.parametrize("fault", [Garble(), NoLogprob()], ids=lambda f: f.spec)
async def test_a_malformed_whole_answer_is_recorded_and_a_clean_502(
    store: Store, dialect: Dialect, fault: Fault
) -> None:
    fake = FakeVLLM(script=lambda body: Reply(text=TEXT, fault=fault))
    async with fake_engine(fake) as engine, running_proxy(store, engine.url) as proxy:
        rollout_id, key = await new_rollout(store)

        status, body = await post(f"{proxy.url}/r/{key}{dialect.path}", dialect.request(False))

        assert status == 502
        error = orjson.loads(body)
        if dialect.name == "messages":
            assert error["type"] == "error"
            assert error["error"]["type"] == "api_error"
        else:
            assert error["error"]["type"] == "upstream_error"
        assert "failed while answering" in str(error)
        call = await only_call(store, rollout_id)
        assert (call.status, call.http_status) == (CallStatus.FAILED, 502)
        response = (await store.call_bodies(call.id)).response
        assert response is not None
        if fault == Garble():
            # The engine's body, not JSON, kept byte for byte.
            assert response.startswith(b'{"id":"chatcmpl-')
            with pytest.raises(orjson.JSONDecodeError):
                orjson.loads(response)
        else:
            assert "logprob" not in orjson.loads(response)["choices"][0]["logprobs"]["content"][0]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_token_ids_the_store_refuses_leave_the_call_recorded_without_them(
    store: Store, stream: bool
) -> None:
    fake = FakeVLLM(script=lambda body: Reply(text=TEXT, fault=BadIds(3)))
    async with fake_engine(fake) as engine, running_proxy(store, engine.url) as proxy:
        rollout_id, key = await new_rollout(store)

        status, body = await post(
            f"{proxy.url}/r/{key}/v1/chat/completions",
            {"model": "m", "messages": [USER], "stream": stream},
        )

        assert status == 200
        if stream:
            assert frames(body)[-1][1] == "[DONE]"
        call = await only_call(store, rollout_id)
        assert call.status is CallStatus.OK
        assert call.capture is Capture.NONE
        assert "token data dropped" in (call.error or "")


@pytest.mark.parametrize("dialect", DIALECTS, ids=lambda d: d.name)
async def test_a_stream_ends_only_once_its_record_is_durable(
    store: Store, db_url: str, dialect: Dialect
) -> None:
    fake = FakeVLLM(script=lambda body: Reply(text=TEXT))
    async with fake_engine(fake) as engine, running_proxy(store, engine.url) as proxy:
        rollout_id, key = await new_rollout(store)
        url = f"{proxy.url}/r/{key}{dialect.path}"
        # A real database error on the record: the store refuses this rollout's calls.
        database = sqlite3.connect(db_url.removeprefix("sqlite:///"))
        database.execute(
            f"CREATE TRIGGER refuse BEFORE INSERT ON call WHEN NEW.rollout_id = '{rollout_id}' "
            "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END"
        )
        database.commit()

        status, body = await post(url, dialect.request(True))

        # Everything the engine said went out, but not the ending: that waits for the record.
        assert status == 200
        events = frames(body)
        assert ended_with_error(dialect.name, events)
        assert not saw_an_ending(dialect.name, events)
        assert await store.calls(rollout_id) == []
        # A whole answer is never sent either; the error is the proxy's, in the dialect.
        status, body = await post(url, dialect.request(False))
        assert status >= 500
        error = orjson.loads(body)
        assert error["type" if dialect.name == "messages" else "error"]

        database.execute("DROP TRIGGER refuse")
        database.commit()
        database.close()
        status, body = await post(url, dialect.request(True))
        assert saw_an_ending(dialect.name, frames(body))
        assert [c.status for c in await store.calls(rollout_id)] == [CallStatus.OK]


@pytest.mark.parametrize("dialect", DIALECTS, ids=lambda d: d.name)
async def test_a_client_leaving_a_whole_answer_stops_the_engine(
    store: Store, dialect: Dialect
) -> None:
    fake = FakeVLLM(script=lambda body: Reply(text="x" * 400, token_delay=0.05))
    async with fake_engine(fake) as engine, running_proxy(store, engine.url) as proxy:
        rollout_id, key = await new_rollout(store)
        client = asyncio.create_task(
            post(f"{proxy.url}/r/{key}{dialect.path}", dialect.request(False))
        )
        while not fake.seen:
            await asyncio.sleep(0.01)

        client.cancel()  # the client hangs up while the engine generates a 20 s answer

        call = await only_call(store, rollout_id)
        assert call.status is CallStatus.CANCELLED
        assert call.error == "client disconnected before the answer was complete"
        assert call.backend == engine.url
        # The engine's handler is cancelled when its loop reads the close, which under load can
        # come after the record landed.
        await until(lambda: fake.disconnects == 1, "the engine saw the proxy's connection close")
        assert fake.disconnects == 1
        assert fake.sent == {}
        await _idle(proxy)


async def _idle(proxy: RunningProxy) -> None:
    """Nothing is left counted in flight, at the hold or on any backend."""
    for _ in range(100):
        if proxy.ctx.hold.inflight == 0 and all(b.inflight == 0 for b in proxy.ctx.pool.all()):
            return
        await asyncio.sleep(0.02)
    raise AssertionError("a call is still counted in flight")


@pytest.mark.model
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_the_real_engine_stops_generating_when_the_client_leaves(
    store: Store, smollm_engine: EngineProcess, stream: bool
) -> None:
    async with running_proxy(store, smollm_engine.url) as proxy:
        rollout_id, key = await new_rollout(store)
        before = await wait_until_idle(smollm_engine.url)
        body = {
            "model": smollm_engine.model,
            "messages": [{"role": "user", "content": "Count from one to ten thousand."}],
            "max_tokens": 4000,
            "ignore_eos": True,
            "stream": stream,
        }
        client = asyncio.create_task(post(f"{proxy.url}/r/{key}/v1/chat/completions", body))
        # A real signal that generation is under way: the engine's own token counter moves.
        while True:
            stats = await engine_stats(smollm_engine.url)
            if (
                stats["running"] == 1
                and stats["generated_tokens"] >= before["generated_tokens"] + 8
            ):
                break
            await asyncio.sleep(0.05)

        client.cancel()
        at_leave = await engine_stats(smollm_engine.url)
        after = await wait_until_idle(smollm_engine.url)

        assert after["requests_cancelled"] == before["requests_cancelled"] + 1
        assert after["requests_finished"] == before["requests_finished"]
        # A 4,000-token answer stopped within a few decode steps of the client leaving.
        assert after["generated_tokens"] - at_leave["generated_tokens"] <= 32
        call = await only_call(store, rollout_id)
        assert call.status is CallStatus.CANCELLED
        if stream:
            tokens = await store.call_tokens(call.id)
            assert len(tokens.choices[0].token_ids) >= 8
        await _idle(proxy)


async def test_a_client_leaving_while_held_at_the_gate_is_recorded(store: Store) -> None:
    async with fake_engine() as engine, running_proxy(store, engine.url) as proxy:
        rollout_id, key = await new_rollout(store)
        proxy.ctx.hold.pause()  # a weight update holds new calls
        client = asyncio.create_task(
            post(f"{proxy.url}/r/{key}/v1/chat/completions", {"messages": [USER]})
        )
        while proxy.ctx.hold.waiting == 0:
            await asyncio.sleep(0.01)

        client.cancel()

        call = await only_call(store, rollout_id)
        assert call.status is CallStatus.CANCELLED
        assert call.error == "client disconnected before dispatch"
        assert proxy.ctx.hold.waiting == 0
        assert engine.fake.requests == []
        proxy.ctx.hold.resume()
        status, _ = await post(f"{proxy.url}/r/{key}/v1/chat/completions", {"messages": [USER]})
        assert status == 200
        await _idle(proxy)
