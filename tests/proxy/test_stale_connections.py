"""A kept-alive connection an engine (or a load balancer in front of it) dropped while idle does
not fail a call: the request goes again, once, on a new connection, and is recorded once
(issue #36; rLLM #505, the keep-alive race, and #592, idle sockets dropped during a weight
update). A connection that dies unanswered when it was new still fails the call, as before.

The engine is a raw asyncio HTTP/1.1 server speaking OpenAI chat completions, whole and streamed,
so that what it does to a connection is exact: which request on which connection it drops, and
how (a close without an answer, or a reset).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Literal

import aiohttp
import orjson
import pytest

from rolltap.proxy.context import ProxySettings
from rolltap.proxy.server import RunningProxy, start_proxy
from rolltap.store import CallStatus, Store
from tests.support.proxy import new_rollout

MESSAGES = [{"role": "user", "content": "hello"}]
ANSWER = "hi there"

Policy = Literal["idle", "reused", "every", "fresh", "partial"]
"""What the engine does to a chat request: `idle`, a load balancer's idle timeout: a connection
idle for over a second is forgotten without a word (no FIN, so the proxy's pool still holds it)
and the next request on it is reset; `reused`: the connection is closed, unanswered, as the next
request arrives on it; `every`: every chat request is closed unanswered; `fresh`: the same, and
nothing is kept alive, so each arrives on a new connection; `partial`: a chat request on a pooled
connection gets the start of a response head, then the close."""


@dataclass
class Seen:
    request_id: str
    first_on_connection: bool


@dataclass
class DroppingEngine:
    policy: Policy
    delay: float = 0.0
    """Seconds before each answer (concurrent calls then each need a connection)."""
    answered: list[Seen] = field(default_factory=list)
    dropped: list[Seen] = field(default_factory=list)

    def chats(self) -> int:
        return len(self.answered) + len(self.dropped)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        served, idle_since = 0, time.monotonic()
        try:
            while True:
                try:
                    method, path, headers, body = await _read_request(reader)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                idle = time.monotonic() - idle_since
                chat = method == "POST" and path == "/v1/chat/completions"
                seen = Seen(headers.get("x-request-id", ""), served == 0)
                if self.policy == "idle" and served and idle > 1.0:
                    if chat:
                        self.dropped.append(seen)
                    _reset(writer)
                    return
                if chat and self.policy == "partial" and served:
                    self.dropped.append(seen)
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")
                    await writer.drain()
                    return
                if chat and (
                    self.policy in ("every", "fresh") or (self.policy == "reused" and served)
                ):
                    self.dropped.append(seen)
                    return  # closed, unanswered
                if chat:
                    await asyncio.sleep(self.delay)
                    self.answered.append(seen)
                    _answer_chat(writer, orjson.loads(body), keep=self.policy != "fresh")
                elif path == "/v1/models":
                    models = {"object": "list", "data": [{"id": "m", "object": "model"}]}
                    _answer(writer, orjson.dumps(models), keep=self.policy != "fresh")
                else:
                    _answer(writer, b"{}", keep=self.policy != "fresh")
                await writer.drain()
                if self.policy == "fresh":
                    return
                served, idle_since = served + 1, time.monotonic()
        finally:
            if not writer.transport.is_closing():
                writer.close()


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str, dict[str, str], bytes]:
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    method, path, _ = head[0].split(" ", 2)
    headers = {}
    for line in head[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    body = await reader.readexactly(length) if length else b""
    return method, path, headers, body


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with an RST, as a load balancer answers a packet on a connection it forgot."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def _answer(writer: asyncio.StreamWriter, body: bytes, *, keep: bool) -> None:
    connection = "keep-alive" if keep else "close"
    writer.write(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\nConnection: {connection}\r\n\r\n".encode()
        + body
    )


def _answer_chat(writer: asyncio.StreamWriter, request: dict[str, object], *, keep: bool) -> None:
    base = {"id": "chatcmpl-1", "created": int(time.time()), "model": "m"}
    usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    if request.get("stream") is not True:
        message = {"role": "assistant", "content": ANSWER}
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        doc = {**base, "object": "chat.completion", "choices": [choice], "usage": usage}
        _answer(writer, orjson.dumps(doc), keep=keep)
        return
    chunk = {**base, "object": "chat.completion.chunk"}
    events = [
        {**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ANSWER}}]},
        {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        {**chunk, "choices": [], "usage": usage},
    ]
    connection = "keep-alive" if keep else "close"
    writer.write(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        + f"Transfer-Encoding: chunked\r\nConnection: {connection}\r\n\r\n".encode()
    )
    for data in [*(orjson.dumps(e) for e in events), b"[DONE]"]:
        event = b"data: " + data + b"\n\n"
        writer.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
    writer.write(b"0\r\n\r\n")


@contextlib.asynccontextmanager
async def dropping_engine(engine: DroppingEngine) -> AsyncIterator[str]:
    server = await asyncio.start_server(engine.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"openai=http://127.0.0.1:{port}"
    finally:
        server.close()
        await server.wait_closed()


@contextlib.asynccontextmanager
async def proxy_for(store: Store, backend: str) -> AsyncIterator[RunningProxy]:
    # No health checks after the first: what the pool holds is only what the calls left there.
    proxy = await start_proxy(
        ProxySettings(backends=[backend], port=0, health_interval=3600), store
    )
    try:
        yield proxy
    finally:
        await proxy.stop()


async def _call(
    session: aiohttp.ClientSession, proxy: RunningProxy, key: str, *, stream: bool
) -> tuple[int, bytes]:
    body = {"model": "m", "messages": MESSAGES, "stream": stream}
    async with session.post(
        f"{proxy.url}/r/{key}/v1/chat/completions", data=orjson.dumps(body)
    ) as resp:
        return resp.status, await resp.read()


def _said(raw: bytes, *, stream: bool) -> str:
    if not stream:
        return str(orjson.loads(raw)["choices"][0]["message"]["content"])
    text = ""
    for line in raw.split(b"\n"):
        if line.startswith(b"data: {"):
            for choice in orjson.loads(line[6:])["choices"]:
                text += choice.get("delta", {}).get("content") or ""
    assert raw.rstrip().endswith(b"data: [DONE]")
    return text


async def _assert_recorded_once_ok(
    store: Store, rollout_id: str, engine: DroppingEngine, calls: int
) -> None:
    records = await store.calls(rollout_id)
    assert len(records) == calls
    assert all((r.status, r.http_status) == (CallStatus.OK, 200) for r in records)
    # Each call was answered once, under its own id; each dropped request went again.
    answered = [s.request_id for s in engine.answered]
    assert sorted(answered) == sorted(r.id for r in records)
    assert engine.dropped, "no request was dropped: the test tested nothing"
    again = {s.request_id: s for s in engine.answered}
    for dropped in engine.dropped:
        assert not dropped.first_on_connection  # it was a pooled connection
        assert again[dropped.request_id].first_on_connection  # retried on a new one
    assert engine.chats() == calls + len(engine.dropped)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_connections_dropped_while_idle_are_sent_again(store: Store, stream: bool) -> None:
    engine = DroppingEngine("idle", delay=0.3)
    async with dropping_engine(engine) as url, proxy_for(store, url) as proxy:
        rollout_id, key = await new_rollout(store)
        async with aiohttp.ClientSession() as client:
            # Three at once leave three connections in the proxy's pool...
            first = await asyncio.gather(*(_call(client, proxy, key, stream=stream) for _ in "abc"))
            assert [status for status, _ in first] == [200, 200, 200]
            warm = len(engine.dropped)  # 0 unless the start's connection idled a second
            # ...all of which the engine forgets: the retry must not take another of them.
            await asyncio.sleep(1.5)
            later = [await _call(client, proxy, key, stream=stream) for _ in range(2)]
        for status, raw in later:
            assert status == 200, raw
            assert _said(raw, stream=stream) == ANSWER
        assert len(engine.dropped) == warm + 2
        await _assert_recorded_once_ok(store, rollout_id, engine, calls=5)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_connection_closed_as_the_request_arrives_is_sent_again(
    store: Store, stream: bool
) -> None:
    engine = DroppingEngine("reused")
    async with dropping_engine(engine) as url, proxy_for(store, url) as proxy:
        rollout_id, key = await new_rollout(store)
        async with aiohttp.ClientSession() as client:
            # The start's health check and model list left one connection in the pool: the
            # first call goes out on it; the second on a new one; the third on that one, pooled.
            results = [await _call(client, proxy, key, stream=stream) for _ in range(3)]
        for status, raw in results:
            assert status == 200, raw
            assert _said(raw, stream=stream) == ANSWER
        assert len(engine.dropped) == 2
        await _assert_recorded_once_ok(store, rollout_id, engine, calls=3)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize(("policy", "sends"), [("fresh", 1), ("every", 2), ("partial", 1)])
async def test_an_engine_that_closes_unanswered_still_fails_the_call(
    store: Store, stream: bool, policy: Policy, sends: int
) -> None:
    """A new connection closed unanswered is the engine failing this request: no retry. A pooled
    one is sent again once, and when the new connection fails too, the call fails. One that
    closes after the engine began its answer (part of a head) is not sent again."""
    engine = DroppingEngine(policy)
    async with dropping_engine(engine) as url, proxy_for(store, url) as proxy:
        rollout_id, key = await new_rollout(store)
        async with aiohttp.ClientSession() as client:
            status, raw = await _call(client, proxy, key, stream=stream)
        assert status == 503
        error = orjson.loads(raw)["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert (error["type"], error["code"]) == ("service_unavailable", "backend_unavailable")
        (record,) = await store.calls(rollout_id)
        assert (record.status, record.http_status) == (CallStatus.FAILED, 503)
        assert not engine.answered
        pooled_then_new = {"fresh": [True], "every": [False, True], "partial": [False]}[policy]
        assert [s.first_on_connection for s in engine.dropped] == pooled_then_new
        assert [s.request_id for s in engine.dropped] == [record.id] * sends
