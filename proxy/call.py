"""One chat completion on an engine, with token capture, for whichever dialect the client speaks.

Failover covers everything before the first byte the client could see: a refused connection, a
gateway status, or a stream that breaks before its first event all move the call (and the
rollout's stickiness) to another backend.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from rolltap.proxy.context import ProxyContext
from rolltap.proxy.engines import EngineKind, Prepared, capture_response, prepare_chat
from rolltap.proxy.errors import UpstreamFailed
from rolltap.proxy.exchange import Exchange, now
from rolltap.proxy.forward import Upstream, open_upstream
from rolltap.proxy.sse import DONE, EventSplitter, event_data

CHAT_PATH = "/v1/chat/completions"
_BROKEN = (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, asyncio.TimeoutError)


class EngineBroke(Exception):
    """The engine's stream failed after it began."""


@dataclass(frozen=True)
class EngineError:
    """The engine answered with an error status of its own (its body passes through)."""

    status: int
    body: bytes


@dataclass(frozen=True)
class Chunk:
    raw: bytes
    """The event's data as the engine sent it."""
    doc: dict[str, Any]


class EngineCall:
    def __init__(self, ctx: ProxyContext, exchange: Exchange, body: dict[str, Any]) -> None:
        self._ctx = ctx
        self._exchange = exchange
        cap = ctx.settings.max_tokens_cap
        self._body = body if cap is None else _capped(body, cap, exchange)
        self.capped = self._body is not body
        """The proxy's max_tokens_cap, not the client, set this call's generation limit."""
        self._stream = body.get("stream") is True
        self._upstream: Upstream | None = None
        self._splitter = EventSplitter()
        self._pending: list[bytes] = []
        self._done = False
        self._prepared: Prepared | None = None
        self.error: EngineError | None = None

    @property
    def prepared(self) -> Prepared:
        """How the request was adapted to the backend that took it (known after `open`)."""
        assert self._prepared is not None
        return self._prepared

    async def open(self) -> None:
        """Dispatch with failover; after it, either `error` is set or the answer can be read."""
        settings = self._ctx.settings
        timeout = aiohttp.ClientTimeout(
            total=None, connect=settings.connect_timeout, sock_read=settings.read_timeout
        )
        excluded: set[str] = set()
        while True:
            upstream = await open_upstream(
                self._ctx.client(),
                self._ctx.pool,
                self._ctx.router,
                self._exchange,
                CHAT_PATH,
                self._prepare,
                timeout,
                excluded,
            )
            self._upstream = upstream
            self._prepared = upstream.prepared
            if upstream.response.status != 200:
                self.error = EngineError(upstream.response.status, await upstream.response.read())
                self._finish_upstream()
                return
            if not self._stream:
                return
            try:
                await self._fill()
            except _BROKEN:
                # Nothing reached the client yet: this is still a failover.
                upstream.release(abort=True)
                self._upstream = None
                self._ctx.pool.mark_failed(upstream.backend)
                excluded.add(upstream.backend.url)
                continue
            if not self._pending and not self._done:
                upstream.release(abort=True)
                self._upstream = None
                excluded.add(upstream.backend.url)
                continue
            return

    def _prepare(self, kind: EngineKind) -> Prepared:
        return prepare_chat(self._body, kind)

    async def read_body(self) -> tuple[bytes, dict[str, Any]]:
        """The whole non-streaming answer, captured."""
        assert self._upstream is not None
        try:
            raw = await self._upstream.response.read()
        except _BROKEN as e:
            self._finish_upstream(abort=True)
            raise EngineBroke(f"{type(e).__name__}: {e}") from e
        self._exchange.first_token_at = now()
        self._finish_upstream()
        try:
            doc = orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            raise UpstreamFailed(f"the engine's answer is not JSON: {e}") from e
        capture_response(doc, self._exchange.captured)
        if isinstance(doc.get("usage"), dict):
            self._exchange.usage = doc["usage"]
        return raw, doc

    async def chunks(self) -> AsyncIterator[list[Chunk]]:
        """The streamed answer as it arrives: the chunks of each network read, captured."""
        while True:
            if self._pending:
                batch = []
                for payload in self._pending:
                    doc = orjson.loads(payload)
                    capture_response(doc, self._exchange.captured)
                    if isinstance(doc.get("usage"), dict):
                        self._exchange.usage = doc["usage"]
                    batch.append(Chunk(payload, doc))
                self._pending = []
                if self._exchange.first_token_at is None:
                    self._exchange.first_token_at = now()
                yield batch
            if self._done:
                self._finish_upstream()
                return
            try:
                await self._fill()
            except _BROKEN as e:
                self._finish_upstream(abort=True)
                raise EngineBroke(f"{type(e).__name__}: {e}") from e

    async def _fill(self) -> None:
        """Read until at least one event is pending or the stream ended."""
        assert self._upstream is not None
        content = self._upstream.response.content
        while not self._pending and not self._done:
            data = await content.readany()
            if not data:
                if self._splitter.leftover.strip():
                    raise aiohttp.ClientPayloadError("stream ended inside an event")
                raise aiohttp.ClientPayloadError("stream ended without [DONE]")
            for event in self._splitter.feed(data):
                payload = event_data(event)
                if payload is None:
                    continue
                if payload == DONE:
                    self._done = True
                    break
                self._pending.append(payload)

    def _finish_upstream(self, *, abort: bool = False) -> None:
        if self._upstream is not None:
            self._exchange.upstream_done = time.perf_counter()
            self._upstream.release(abort=abort)
            self._upstream = None

    def close(self) -> None:
        """Abort whatever is still open (a client that went away cancels the engine request)."""
        self._finish_upstream(abort=True)


def _capped(body: dict[str, Any], cap: int, exchange: Exchange) -> dict[str, Any]:
    """The request with its generation limit lowered to the proxy's cap, noted on the call."""
    keys = [k for k in ("max_tokens", "max_completion_tokens") if body.get(k) is not None]
    asked = [body[k] for k in keys]
    if keys and all(isinstance(v, int) and v <= cap for v in asked):
        return body
    was = f"max_tokens {asked[0]}" if asked else "no max_tokens"
    exchange.notes.append(f"{was} lowered to {cap} by the proxy's max_tokens_cap")
    return {**body, **{k: cap for k in keys or ["max_tokens"]}}
