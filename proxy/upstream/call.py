"""One chat completion on an engine, with token capture, for whichever dialect the client speaks.

Failover covers everything before the first byte the client could see: a refused connection, a
gateway status, or a stream that breaks before its first event all move the call (and the
rollout's stickiness) to another backend.

`EngineCall` is the chat-completions implementation of relay.py's `EngineAnswer`. What the engine
sends is checked here, once, for every dialect: a body or chunk that is not a JSON object, whose
capture fields are malformed (a logprob entry without its `logprob`), or that is the engine's
own error event raises `EngineBroke` (`EngineGarbled`, holding the bytes, when they could not be
read).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
import orjson

from . import resume
from .engines import EngineKind, Prepared, ask_routed_experts, capture_response, prepare_chat
from .exchange import Exchange, now
from .forward import Upstream, open_upstream
from .leg import Leg
from .sampling import cache_salt, impose
from .sse import DONE, EventSplitter, event_data

CHAT_PATH = "/v1/chat/completions"
_BROKEN = (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, asyncio.TimeoutError)


class EngineBroke(Exception):
    """The engine's answer failed after it began."""


class EngineGarbled(EngineBroke):
    """The engine sent bytes that cannot be read as a chat answer; they are kept as they came."""

    def __init__(self, message: str, raw: bytes) -> None:
        super().__init__(message)
        self.raw = raw


# What reading a malformed document raises: orjson's JSONDecodeError is a ValueError; a value of
# the wrong type surfaces as KeyError, TypeError or AttributeError inside capture.
_UNREADABLE = (ValueError, KeyError, TypeError, AttributeError, IndexError)


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


class Route(Protocol):
    """How a call reaches its engine other than as a plain chat request, its answers read back
    as chat ones (token-in: proxy/tokenin/route.py, proxy/tokenin/chatroute.py)."""

    reads_text: bool
    """The engine answers raw text that the route parses; an answer aborted for a weight
    update is then continued through the route too (else read as any chat call's)."""

    def prepare(self, chat: dict[str, Any], kind: EngineKind) -> Prepared:
        """The engine request for the chat request `chat`, its path set."""
        ...

    def whole(self, doc: dict[str, Any], *, resumes: bool = False) -> dict[str, Any]:
        """A whole answer of the route as a chat completion. `resumes`: an answer the engine
        aborted will be continued on the same route (resume.py), and the continuation's answer
        read by this route too: what the abort cut off is not yet ended."""
        ...

    def chunk(self, doc: dict[str, Any], *, resumes: bool = False) -> dict[str, Any]:
        """One streamed event of the route as a chat completion chunk (`resumes`: as above)."""
        ...


class EngineCall:
    def __init__(self, leg: Leg, body: dict[str, Any], *, route: Route | None = None) -> None:
        """`leg`: the call as the proxy took it in; its rollout's batch may impose sampling
        options (sampling.py), and an answer aborted for a weight update is recorded under it
        (resume.py). `route`: where the call goes instead of chat completions."""
        ctx, exchange, rollout = leg.ctx, leg.exchange, leg.state
        self._leg = leg
        self._ctx = ctx
        self._route = route
        self._exchange = exchange
        self._answer = exchange.answer
        self.place = rollout.dispatched
        """How many engine calls the rollout made before this one (its seed derives from it)."""
        rollout.dispatched += 1
        if rollout.sampling is not None:
            body = impose(body, rollout.sampling.for_call(self.place))
        terms = exchange.terms
        if terms.served_model is not None:
            body = {**body, "model": terms.served_model}
        cap = ctx.settings.max_tokens_cap
        self._body = body if cap is None else _capped(body, cap, exchange)
        self.capped = self._body is not body
        """The proxy's max_tokens_cap, not the client, set this call's generation limit."""
        if terms.token_allowance is not None:
            budget = "the rollout's token budget"
            self._body = _capped(self._body, terms.token_allowance, exchange, budget)
        self._stream = body.get("stream") is True
        self._upstream: Upstream | None = None
        self._splitter = EventSplitter()
        self._pending: list[bytes] = []
        self._done = False
        self._prepared: Prepared | None = None
        self.error: EngineError | None = None
        self._aborts = 0
        """The hold's abort_resume count when this call was dispatched."""
        self._kind: EngineKind | None = None
        self._head: dict[str, Any] = {}
        """id, created and model of the first streamed chunk (a continuation keeps them)."""
        self._said = ""
        """Content streamed so far (a partial answer's record)."""
        self._continuation: dict[str, Any] = {}
        """The completions request continuing an aborted answer."""

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
        self._aborts = self._ctx.hold.aborts
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
            self._kind = upstream.backend.kind
            if upstream.response.status != 200:
                try:
                    body = await upstream.response.read()
                except _BROKEN as e:
                    self._finish_upstream(abort=True)
                    raise EngineBroke(f"engine failed while refusing: {named(e)}") from e
                self.error = EngineError(upstream.response.status, body)
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
        body = self._body
        if kind is EngineKind.VLLM and self._ctx.settings.cache_salt:
            # Dispatched now, under the hold's current version (relay.py entered it).
            salt = cache_salt(self._exchange.weight_version, body.get("cache_salt"))
            body = {**body, "cache_salt": salt}
        elif body.get("cache_salt") == "":
            # An empty salt means none, and vLLM's Rust frontend refuses it (vllm#53218).
            body = {k: v for k, v in body.items() if k != "cache_salt"}
        if self._route is not None:
            prepared = self._route.prepare(body, kind)
        else:
            prepared = prepare_chat(body, kind)
        routed = self._exchange.terms.routed_experts
        return ask_routed_experts(prepared, kind) if routed else prepared

    async def read_body(self) -> tuple[bytes, dict[str, Any]]:
        """The whole non-streaming answer, captured."""
        assert self._upstream is not None
        try:
            raw = await self._upstream.response.read()
        except _BROKEN as e:
            self._finish_upstream(abort=True)
            raise EngineBroke(f"engine failed while answering: {named(e)}") from e
        self._answer.first_token_at = now()
        self._finish_upstream()
        raw, doc = self._read(raw, "answer")
        if not self._resumable(doc):
            return raw, doc
        # Aborted for a weight update: continue it on the new weights, answer as one.
        first = self._first_usage()
        await self._hand_over(raw)
        tail, usage = await self._continue_whole()
        merged = resume.merged_answer(doc, tail, usage, first)
        return orjson.dumps(merged), merged

    async def chunks(self) -> AsyncGenerator[list[Chunk], None]:
        """The streamed answer as it arrives: the chunks of each network read, captured. An
        answer aborted for a weight update goes on with its continuation's chunks."""
        async with contextlib.aclosing(self._events(self._chunk)) as answer:
            async for batch in answer:
                cut = next((i for i, c in enumerate(batch) if self._resumable(c.doc)), None)
                if cut is None:
                    yield batch
                    continue
                # The aborting chunk may still carry text: it goes out, without its ending.
                yield [*batch[:cut], _unfinished(batch[cut])]
                break
            else:
                return
        first = self._first_usage()
        message = {"role": "assistant", "content": self._said}
        partial = {"choices": [{"index": 0, "message": message, "finish_reason": "abort"}]}
        await self._hand_over(orjson.dumps(partial))
        await self._continue_open(stream=True)
        continued = functools.partial(self._continued_chunk, first=first)
        async with contextlib.aclosing(self._events(continued)) as rest:
            async for batch in rest:
                yield batch

    async def _events(self, read: Callable[[bytes], Chunk]) -> AsyncGenerator[list[Chunk], None]:
        while True:
            if self._pending:
                batch = [read(payload) for payload in self._pending]
                self._pending = []
                if self._answer.first_token_at is None:
                    self._answer.first_token_at = now()
                yield batch
            if self._done:
                self._finish_upstream()
                return
            try:
                await self._fill()
            except _BROKEN as e:
                self._finish_upstream(abort=True)
                raise EngineBroke(f"engine stream broke: {named(e)}") from e

    def _chunk(self, raw: bytes) -> Chunk:
        raw, doc = self._read(raw, "chunk")
        if not self._head:
            self._head = {k: doc[k] for k in ("id", "created", "model") if k in doc}
        for choice in doc.get("choices") or ():
            delta = choice.get("delta") if isinstance(choice, dict) else None
            if isinstance(delta, dict) and isinstance(delta.get("content"), str):
                self._said += delta["content"]
        return Chunk(raw, doc)

    def _may_resume(self) -> bool:
        """Whether an abort read now could be continued, as far as the call alone tells."""
        if self._ctx.hold.aborts <= self._aborts:
            return False
        return (self._body.get("n") or 1) == 1 and self._kind is EngineKind.VLLM

    # -- resuming an answer aborted for a weight update (resume.py) ------------------------------

    def _resumable(self, doc: dict[str, Any]) -> bool:
        """An answer of one choice that its engine aborted after an abort_resume update began
        (not before this call was dispatched: an abort of anyone else's passes through)."""
        choices = doc.get("choices")
        if not choices or len(choices) != 1 or choices[0].get("finish_reason") != "abort":
            return False
        if not self._may_resume():
            return False
        captured = self._answer.captured
        return captured.prompt_ids is not None and captured.choice(0).has_ids

    def _first_usage(self) -> tuple[int, int]:
        captured = self._answer.captured
        return len(captured.prompt_ids or ()), len(captured.choice(0).token_ids)

    async def _hand_over(self, partial_body: bytes) -> None:
        """Record the partial answer as its own call, then wait for the update to commit; this
        call goes on as the continuation."""
        self._finish_upstream(abort=True)
        exchange = self._exchange
        captured = self._answer.captured
        prompt, partial = list(captured.prompt_ids or ()), list(captured.choice(0).token_ids)
        first = exchange.aborted_part(partial_body)
        await asyncio.shield(self._leg.record(first))
        exchange.continues(first)
        self._continuation = resume.continuation_request(self.prepared.body, prompt, partial)
        exchange.runs_under(await self._ctx.hold.wait_out())
        await self._leg.bound()  # the continuation goes to an engine too
        if "cache_salt" in self._continuation:
            # Continued on the new weights: none of the old version's cache may serve it.
            own = self._body.get("cache_salt")
            self._continuation["cache_salt"] = cache_salt(exchange.weight_version, own)

    async def _continue_open(self, *, stream: bool) -> None:
        settings = self._ctx.settings
        timeout = aiohttp.ClientTimeout(
            total=None, connect=settings.connect_timeout, sock_read=settings.read_timeout
        )
        prepared = dataclasses.replace(self.prepared, body=self._continuation)
        upstream = await open_upstream(
            self._ctx.client(),
            self._ctx.pool,
            self._ctx.router,
            self._exchange,
            resume.COMPLETIONS_PATH,
            lambda kind: prepared,
            timeout,
            set(),
        )
        self._upstream = upstream
        if upstream.response.status != 200:
            body = await upstream.response.read()
            self._finish_upstream()
            raise EngineBroke(
                f"the engine refused to continue the aborted answer: HTTP "
                f"{upstream.response.status}: {error_message(body)}"
            )
        self._splitter, self._pending, self._done = EventSplitter(), [], False
        assert stream == (self._continuation.get("stream") is True)

    async def _continue_whole(self) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """The continuation's whole answer as chat, and its own usage."""
        await self._continue_open(stream=False)
        assert self._upstream is not None
        try:
            raw = await self._upstream.response.read()
        except _BROKEN as e:
            self._finish_upstream(abort=True)
            raise EngineBroke(f"engine failed while continuing: {named(e)}") from e
        self._finish_upstream()
        doc = self._parse(raw, "continuation")
        try:
            if self._route is not None and self._route.reads_text:
                chat = self._route.whole(doc)
            else:
                chat = resume.chat_part(doc)
            capture_response(chat, self._answer.captured)
        except _UNREADABLE as e:
            raise EngineGarbled(f"unreadable engine continuation: {named(e)}", raw) from e
        usage = doc.get("usage") if isinstance(doc.get("usage"), dict) else None
        if usage is not None:
            self._answer.usage = usage
        return chat, usage

    def _continued_chunk(self, raw: bytes, first: tuple[int, int]) -> Chunk:
        doc = self._parse(raw, "continuation chunk")
        try:
            if self._route is None or not self._route.reads_text:
                chat = resume.chat_chunk(doc, self._head, first)
            else:
                chat = self._route.chunk(doc)
                if isinstance(doc.get("usage"), dict):
                    chat["usage"] = resume.client_usage(doc["usage"], first)
            capture_response(chat, self._answer.captured)
        except _UNREADABLE as e:
            raise EngineGarbled(f"unreadable engine continuation: {named(e)}", raw) from e
        if isinstance(doc.get("usage"), dict):
            self._answer.usage = doc["usage"]  # the record counts the second call's own
        return Chunk(orjson.dumps(chat), chat)

    def _parse(self, raw: bytes, what: str) -> dict[str, Any]:
        try:
            doc = orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            raise EngineGarbled(f"unreadable engine {what}: {named(e)}", raw) from e
        if not isinstance(doc, dict) or ("error" in doc and not doc.get("choices")):
            raise EngineBroke(f"engine error in its {what}: {error_message(raw)}")
        return doc

    def _read(self, raw: bytes, what: str) -> tuple[bytes, dict[str, Any]]:
        """One engine document, parsed (as chat, through the route) and captured; EngineBroke if
        it is no answer."""
        try:
            doc = orjson.loads(raw)
            if not isinstance(doc, dict):
                raise TypeError(f"a JSON {type(doc).__name__}, not an object")
            if doc.get("object") == "error" or (
                "error" in doc and not doc.get("choices") and "text" not in doc
            ):
                raise EngineBroke(f"engine error in its {what}: {error_message(raw)}")
            if self._route is not None:
                resumes = self._may_resume()
                if what == "chunk":
                    doc = self._route.chunk(doc, resumes=resumes)
                else:
                    doc = self._route.whole(doc, resumes=resumes)
                raw = orjson.dumps(doc)
            capture_response(doc, self._answer.captured)
        except _UNREADABLE as e:
            raise EngineGarbled(f"unreadable engine {what}: {named(e)}", raw) from e
        if isinstance(doc.get("usage"), dict):
            self._answer.usage = doc["usage"]
        return raw, doc

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
            self._answer.upstream_done = time.perf_counter()
            self._upstream.release(abort=abort)
            self._upstream = None

    def close(self) -> None:
        """Abort whatever is still open (a client that went away cancels the engine request)."""
        self._finish_upstream(abort=True)


def _unfinished(chunk: Chunk) -> Chunk:
    """The chunk without its choice's ending (what it carries still goes to the client)."""
    choices = [
        {k: v for k, v in c.items() if k not in ("stop_reason", "weight_versions")}
        | {"finish_reason": None}
        for c in chunk.doc["choices"]
    ]
    doc = {**chunk.doc, "choices": choices}
    return Chunk(orjson.dumps(doc), doc)


def error_message(body: bytes) -> str:
    """The message of an engine's error body (OpenAI's shape or vLLM's), else its first bytes."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body[:300].decode(errors="replace")
    error = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])[:1000]
    if isinstance(doc, dict) and doc.get("object") == "error" and doc.get("message"):
        return str(doc["message"])[:1000]
    return body[:300].decode(errors="replace")


def named(error: BaseException) -> str:
    """An exception as one line: its type and message."""
    return f"{type(error).__name__}: {error}"


def _capped(
    body: dict[str, Any], cap: int, exchange: Exchange, by: str = "the proxy's max_tokens_cap"
) -> dict[str, Any]:
    """The request with its generation limit lowered to `cap`, noted on the call."""
    keys = [k for k in ("max_tokens", "max_completion_tokens") if body.get(k) is not None]
    asked = [body[k] for k in keys]
    if keys and all(isinstance(v, int) and v <= cap for v in asked):
        return body
    was = f"max_tokens {asked[0]}" if asked else "no max_tokens"
    exchange.notes.append(f"{was} lowered to {cap} by {by}")
    return {**body, **{k: min(body[k], cap) if k in keys else cap for k in keys or ["max_tokens"]}}
