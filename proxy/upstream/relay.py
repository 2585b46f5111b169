"""One engine call, from the weight hold to its record, for whichever dialect the client speaks.

Chat Completions, Responses and Messages all run their engine call through `relay`; a dialect
only says how the answer looks to its client (a `Rendering`). The life of a call:

    hold -> dispatch (failover) -+- no backend ------------> record FAILED -> error (middleware)
                                 +- engine refused --------> record FAILED -> the refusal
                                 +- whole answer -> read -> render -> record OK -> 200
                                 |     broken, unreadable -> record FAILED -> 502 in the dialect
                                 +- stream -> prepare -> relay chunks (the ending held back)
                                       -> record OK -> write the ending
                                       any error -> record FAILED -> the dialect's error event
    the client leaves at any point -> abort the engine request -> record CANCELLED

Every call that reached the hold is recorded exactly once, with whatever was received, and the
record is shielded: a client that leaves (aiohttp cancels the handler, `handler_cancellation`)
cannot interrupt it. A stream's ending (chat: the chunks carrying the last `finish_reason` and
usage, then `[DONE]`; Responses: `response.completed`; Messages: `message_stop`) is written only
once the record is durable, so a client that saw an answer end can rely on its record. After a
stream's headers went out nothing escapes the relay but cancellation: the error middleware never
writes a second response into an event stream.

`response_body` records what the client was answered (a stream assembled as one body), except
when the engine's bytes could not be read: then it holds those bytes as they came (the whole
body, or the offending event of a stream); the ids captured before it are kept either way.

Seams, for routes that obtain or shape answers differently:
- `EngineAnswer`: how the answer is obtained. `EngineCall` (call.py) sends a chat completion with
  token capture. A token-in route implements the same protocol and yields chat-shaped `Chunk`s;
  a call that must survive an engine being swapped (weight updates) resumes inside `chunks()`,
  so the relay sees one answer.
- `Rendering`: how the answer looks to the client; chat.py and translated.py provide one each.
- `Leg` (leg.py): the call as the proxy took it in (intake.py's Intake): its exchange, the
  engines and the hold, and what the proxy above does at the hold (`bound`) and the record
  (`record`), so the relay imports nothing above upstream/.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from aiohttp import web

from ...store import CallStatus, InvalidTokens
from ..errors import ProxyError, StaleRollout, UpstreamFailed
from .call import Chunk, EngineBroke, EngineError, EngineGarbled, error_message, named
from .engines import Prepared
from .exchange import now
from .leg import Leg

log = logging.getLogger("rolltap.proxy")

_STREAM_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
CLIENT_GONE = (asyncio.CancelledError, ConnectionResetError)
"""How a client that hung up shows in a handler: cancelled, or a write that found it gone."""


class EngineAnswer(Protocol):
    """One engine answer being obtained (call.py's EngineCall is the chat-completions one)."""

    error: EngineError | None
    """Set by `open` when the engine refused the request with a status of its own."""
    capped: bool
    """The proxy's max_tokens_cap, not the client, set this call's generation limit."""

    @property
    def prepared(self) -> Prepared: ...

    async def open(self) -> None:
        """Dispatch (with failover); ProxyError when no backend could take the call."""
        ...

    async def read_body(self) -> tuple[bytes, dict[str, Any]]:
        """The whole answer, raw and parsed as a chat completion; EngineBroke if it failed."""
        ...

    def chunks(self) -> AsyncIterator[list[Chunk]]:
        """The streamed answer as chat completion chunks, a network read at a time."""
        ...

    def close(self) -> None:
        """Abort the engine request if it is still open (idempotent)."""
        ...


class Rendering(Protocol):
    """How one answer looks to the client: the dialect's half of the relay."""

    def refused(self, status: int, body: bytes) -> bytes:
        """The client's error body for an engine that refused the request."""
        ...

    def whole(self, raw: bytes, doc: dict[str, Any]) -> bytes:
        """The client's body for a whole (non-streaming) answer."""
        ...

    def feed(self, chunk: Chunk) -> bytes:
        """Frames to send now for one engine chunk; what ends the answer is held back."""
        ...

    def ending(self) -> bytes:
        """The held-back frames and whatever closes the stream, written after the record."""
        ...

    def failure(self) -> bytes:
        """Frames ending the stream with the dialect's error event (held-back frames dropped)."""
        ...

    def recorded(self) -> bytes:
        """The stream as the client has it so far, as one body, for the record."""
        ...


async def relay(
    request: web.Request,
    taken: Leg,
    call: EngineAnswer,
    rendering: Callable[[EngineAnswer], Rendering],
) -> web.StreamResponse:
    """Run the call and answer the client; `rendering` is built once the call is dispatched."""
    return await _Relay(request, taken, call).run(rendering)


class _Relay:
    def __init__(self, request: web.Request, taken: Leg, call: EngineAnswer) -> None:
        self._request = request
        self._taken = taken
        self._exchange = taken.exchange
        self._call = call
        self._rendering: Rendering | None = None
        self._streaming = False
        """Headers are out: the answer so far is the rendering's, errors become events."""
        self._recorded = False

    async def run(self, rendering: Callable[[EngineAnswer], Rendering]) -> web.StreamResponse:
        hold = self._taken.ctx.hold
        entered = False
        try:
            self._exchange.runs_under(await hold.enter())
            entered = True
            # Checked here, not at admission: a call that waited out an update runs on the new
            # weights, and is judged by them.
            await self._taken.bound()
            await self._call.open()
            self._rendering = rendering(self._call)
            if self._call.error is not None:
                return await self._refused(self._rendering, self._call.error)
            if self._exchange.asked.stream:
                return await self._stream(self._rendering)
            return await self._whole(self._rendering)
        except BaseException as e:
            await self._settle(e)
            if isinstance(e, EngineBroke) and not self._streaming:
                raise UpstreamFailed(f"the backend failed while answering: {e}") from e
            raise
        finally:
            self._call.close()
            if entered:
                hold.leave()
            observe_call(self._taken)

    async def _refused(self, rendering: Rendering, error: EngineError) -> web.Response:
        out = rendering.refused(error.status, error.body)
        self._exchange.fail(CallStatus.FAILED, error.status, error_message(error.body), out)
        self._taken.ctx.metrics.errors.inc(kind=f"engine_{error.status}")
        await self._record()
        return web.Response(status=error.status, body=out, content_type="application/json")

    async def _whole(self, rendering: Rendering) -> web.Response:
        raw, doc = await self._call.read_body()
        try:
            out = rendering.whole(raw, doc)
        except Exception as e:
            raise EngineGarbled(f"engine answer could not be rendered: {named(e)}", raw) from e
        self._exchange.answered(out)
        await self._record()
        return web.Response(body=out, content_type="application/json")

    async def _stream(self, rendering: Rendering) -> web.StreamResponse:
        response = web.StreamResponse(headers=_STREAM_HEADERS)
        pending: list[bytes] = []
        try:
            await response.prepare(self._request)
            self._streaming = True
            async for batch in self._call.chunks():
                for chunk in batch:
                    pending.append(_fed(rendering, chunk))
                data = b"".join(pending)
                pending.clear()
                if data:
                    await response.write(data)
            ending = rendering.ending()
            self._exchange.answered(rendering.recorded())
            await self._record()
        except Exception as e:
            gone = isinstance(e, ConnectionResetError)
            if not (self._streaming or gone):
                raise  # no headers out yet: run() settles it and the middleware answers
            await self._settle(e)
            if not gone:
                # Frames rendered before the failure are the client's; the error event follows.
                await write_last(response, b"".join(pending) + _failure(rendering))
            return response
        await write_last(response, ending)
        return response

    async def _settle(self, error: BaseException) -> None:
        """Record how the call ended unless it already is: cancelled, or failed with `error`."""
        if self._recorded:
            if not isinstance(error, CLIENT_GONE):
                log.error("could not record call %s: %s", self._exchange.call_id, named(error))
            return
        self._call.close()  # a client that left cancels the engine request before anything else
        exchange = self._exchange
        metrics = self._taken.ctx.metrics
        # What the client has of the answer: the engine's unreadable bytes, or the stream so far.
        body = None
        if isinstance(error, EngineGarbled):
            body = error.raw
        elif self._streaming and self._rendering is not None:
            body = _so_far(self._rendering)
        if isinstance(error, CLIENT_GONE):
            where = "mid-stream" if self._streaming else "before the answer was complete"
            if exchange.dispatch.at is None:
                where = "before dispatch"
            exchange.fail(CallStatus.CANCELLED, None, f"client disconnected {where}", body)
        elif isinstance(error, StaleRollout) and exchange.dispatch.at is None:
            exchange.reject(error)  # refused before any engine saw it
            metrics.errors.inc(kind=error.code or error.type)
        elif isinstance(error, ProxyError):
            exchange.fail(CallStatus.FAILED, error.status, error.message, body)
            metrics.errors.inc(kind=error.code or error.type)
        elif isinstance(error, EngineBroke):
            exchange.fail(CallStatus.FAILED, 502, str(error), body)
            metrics.errors.inc(kind="engine_broke")
        else:
            log.error("relaying call %s failed", exchange.call_id, exc_info=error)
            exchange.fail(
                CallStatus.FAILED, 500, f"the proxy failed relaying: {named(error)}", body
            )
            metrics.errors.inc(kind="relay_error")
        try:
            await self._record()
        except Exception as e:
            # The original failure is what the client hears about; this one is logged.
            log.error("could not record call %s: %s", exchange.call_id, named(e))

    async def _record(self) -> None:
        """Make the call durable, once; a client leaving meanwhile does not interrupt it."""
        self._recorded = True
        await asyncio.shield(self._durable())

    async def _durable(self) -> None:
        exchange = self._taken.exchange
        try:
            await self._taken.record(exchange)
        except InvalidTokens as e:
            # The call is kept, without the token data the store refused.
            exchange.drop_tokens(str(e))
            await self._taken.record(exchange)


def _fed(rendering: Rendering, chunk: Chunk) -> bytes:
    try:
        return rendering.feed(chunk)
    except Exception as e:
        raise EngineGarbled(f"engine chunk could not be rendered: {named(e)}", chunk.raw) from e


def _failure(rendering: Rendering) -> bytes:
    try:
        return rendering.failure()
    except Exception as e:
        # Rendering broke the stream already; ending it without the event still fails the client.
        log.error("could not render the failure event: %s", named(e))
        return b""


def _so_far(rendering: Rendering) -> bytes | None:
    try:
        return rendering.recorded()
    except Exception as e:
        log.error("could not assemble the partial answer: %s", named(e))
        return None


async def write_last(response: web.StreamResponse, data: bytes) -> None:
    try:
        await response.write(data)
        await response.write_eof()
    except ConnectionResetError:
        pass


def observe_call(taken: Leg) -> None:
    exchange = taken.exchange
    answer, dispatched_at = exchange.answer, exchange.dispatch.at
    metrics = taken.ctx.metrics
    finished = exchange.outcome.finished_at or now()
    total = (finished - exchange.received_at).total_seconds()
    metrics.latency.observe(total, dialect=exchange.dialect.value)
    if answer.first_token_at is not None and exchange.asked.stream:
        metrics.ttft.observe((answer.first_token_at - exchange.received_at).total_seconds())
    if dispatched_at is not None and answer.upstream_done is not None:
        before = (dispatched_at - exchange.received_at).total_seconds()
        after = time.perf_counter() - answer.upstream_done
        metrics.overhead.observe(before + after, dialect=exchange.dialect.value)
