"""Open one engine response for a call, failing over to another backend before the first byte."""

from __future__ import annotations

import dataclasses
import errno
import logging
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace

import aiohttp
import orjson

from ..errors import UpstreamUnavailable
from .backends import Backend, BackendPool
from .engines import EngineKind, Prepared
from .exchange import Exchange, now
from .resume import COMPLETIONS_PATH
from .routing import StickyRouter

log = logging.getLogger("rolltap.proxy")

# A gateway-ish status from an engine means "not me, not now": try another backend.
_RETRY_ELSEWHERE = {502, 503, 504}

# A kept-alive connection to an engine can be dead by the time a call goes out on it: the
# engine's (or a load balancer's) idle timeout closed it as the request left (the keep-alive
# race, rLLM #505), or dropped it without a word and resets the next packet (idle sockets cut in
# a weight-update window, rLLM #592). aiohttp sends a request again only for idempotent methods,
# and every engine call is a POST, so `_send` does it, once, and only when all of these hold:
# - the connection came from the pool (aiohttp's trace says so, `connection_tracing`); a fresh
#   connection that dies unanswered is an engine failing this request, and fails over as ever;
# - it failed as a dropped connection does (`_dropped_unanswered`: closed before any byte of a
#   response head came back, reset, broken pipe), never on a timeout;
# - before the response head: `session.post` returns at the head, so nothing of an answer has
#   reached rolltap, its record or its client, which see only the second attempt's answer.
# An engine that did take the first request (a balancer cutting a live connection) lost that
# request's connection, which is what vLLM and SGLang abort a request on (Upstream.release's
# abort relies on it too), and aiohttp has closed its end: there is no abort left to send, and
# the first generation has nowhere to answer. The cost is at most one duplicate generation per
# backend tried, never a second answer.
# The second attempt keeps the call's X-Request-Id (the engine logs both under the one call) and
# goes out on a connection of its own, not the pool's: the idle timeout that killed one pooled
# connection has most likely killed its neighbours too. If it fails, that is a plain failure.
_DROPPED_ERRNOS = frozenset({errno.ECONNRESET, errno.EPIPE})


@dataclass
class Upstream:
    backend: Backend
    response: aiohttp.ClientResponse
    prepared: Prepared
    own: aiohttp.ClientSession | None = None
    """The one-off session the response came on, when a stale pooled connection was retried."""

    def release(self, *, abort: bool = False) -> None:
        """Let go of the engine. Aborting closes the connection, which cancels the request."""
        if abort:
            self.response.close()
        else:
            self.response.release()
        self.backend.inflight -= 1
        if self.own is not None:
            # Its connector (force_close) closed the connection on release and holds nothing
            # more: detached, the session is closed with nothing left open or to await.
            self.own.detach()
            self.own = None


class _Attempt:
    """One dispatch's trace context: whether aiohttp took its connection from the pool, and
    when its last send went out."""

    __slots__ = ("at", "reused")

    def __init__(self) -> None:
        self.reused = False
        self.at = now()


async def _on_reuse(
    session: aiohttp.ClientSession,
    context: SimpleNamespace,
    params: aiohttp.TraceConnectionReuseconnParams,
) -> None:
    attempt = context.trace_request_ctx
    if isinstance(attempt, _Attempt):
        attempt.reused = True


def connection_tracing() -> aiohttp.TraceConfig:
    """What the proxy's engine session carries so that `open_upstream` can tell a pooled
    connection from a fresh one (a session without it never sends a call twice)."""
    tracing = aiohttp.TraceConfig()
    tracing.on_connection_reuseconn.append(_on_reuse)
    return tracing


def _dropped_unanswered(e: aiohttp.ClientConnectionError) -> bool:
    """`e` is a connection dropped before any of a response came back."""
    if isinstance(e, aiohttp.ServerDisconnectedError):
        # Its message is the response head as far as it was read, when any of it came.
        return isinstance(e.message, str)
    if isinstance(e, aiohttp.ClientConnectionResetError):
        return True  # the request could not be written
    if isinstance(e, aiohttp.ClientOSError) and not isinstance(e, aiohttp.ClientConnectorError):
        return e.errno in _DROPPED_ERRNOS
    return False


async def _send(
    session: aiohttp.ClientSession,
    url: str,
    data: bytes,
    headers: dict[str, str],
    timeout: aiohttp.ClientTimeout,
    attempt: _Attempt,
) -> tuple[aiohttp.ClientResponse, aiohttp.ClientSession | None]:
    """The engine's response head, and the one-off session it came on if the pooled connection
    was stale and the request went again (why that is safe: the comment at the top)."""
    try:
        response = await session.post(
            url, data=data, headers=headers, timeout=timeout, trace_request_ctx=attempt
        )
        return response, None
    except aiohttp.ClientConnectionError as e:
        if not (attempt.reused and _dropped_unanswered(e)):
            raise
        log.info("%s dropped a kept-alive connection unanswered (%r); sending once more", url, e)
    attempt.at = now()
    own = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(force_close=True), auto_decompress=session.auto_decompress
    )
    try:
        return await own.post(url, data=data, headers=headers, timeout=timeout), own
    except BaseException:
        await own.close()
        raise


async def open_upstream(
    session: aiohttp.ClientSession,
    pool: BackendPool,
    router: StickyRouter,
    exchange: Exchange,
    path: str,
    prepare: Callable[[EngineKind], Prepared],
    timeout: aiohttp.ClientTimeout,
    tried: set[str],
) -> Upstream:
    """Dispatch to the rollout's backend; `tried` collects the backends that failed."""
    last_error = "no healthy backend"
    while True:
        try:
            backend = router.pick(exchange.rollout_id, exclude=frozenset(tried))
        except UpstreamUnavailable:
            raise UpstreamUnavailable(
                f"no backend could take the call ({last_error})", code="backend_unavailable"
            ) from None
        prepared = _limited(prepare(backend.kind), backend, path)
        engine_request = orjson.dumps(prepared.body)
        headers = {
            "Content-Type": "application/json",
            "X-Session-ID": exchange.rollout_id,
            "X-Request-Id": exchange.call_id,
        }
        backend.inflight += 1
        attempt = _Attempt()
        url = backend.endpoint(prepared.path or path)
        try:
            response, own = await _send(session, url, engine_request, headers, timeout, attempt)
        except (TimeoutError, aiohttp.ClientConnectionError) as e:
            backend.inflight -= 1
            exchange.tried(attempt.at)
            pool.mark_failed(backend)
            tried.add(backend.url)
            last_error = f"{backend.url}: {type(e).__name__}"
            others = any(b.url not in tried for b in pool.healthy())
            log.warning(
                "backend %s failed before answering (%s)%s",
                backend.url,
                e,
                "; failing over" if others else "",
            )
            continue
        except BaseException:
            # The client left while the engine worked on the request (a whole answer arrives
            # with its headers): aiohttp has closed the connection, which stops the engine.
            backend.inflight -= 1
            exchange.sent(attempt.at, backend.url, engine_request)
            raise
        upstream = Upstream(backend, response, prepared, own)
        if response.status in _RETRY_ELSEWHERE:
            upstream.release(abort=True)
            exchange.tried(attempt.at)
            pool.mark_failed(backend)
            tried.add(backend.url)
            last_error = f"{backend.url}: HTTP {response.status}"
            continue
        exchange.sent(attempt.at, backend.url, engine_request)
        backend.served += 1
        return upstream


def _limited(prepared: Prepared, backend: Backend, path: str) -> Prepared:
    """A token-in or continuation completions request without a limit (`max_tokens: null`,
    the chat route's default: all the context leaves) with that limit spelled out for vLLM,
    whose completions read null as their default of 16 tokens (0.33: `CompletionRequest
    .normalize_null_max_tokens`). rolltap's engine, whose card is not vLLM's, keeps null."""
    body = prepared.body
    prompt = body.get("prompt")
    completions = (prepared.path or path) == COMPLETIONS_PATH
    if backend.context is None or not completions or not isinstance(prompt, list):
        return prepared
    if "max_tokens" not in body or body["max_tokens"] is not None:
        return prepared
    room = max(1, backend.context - len(prompt))
    return dataclasses.replace(prepared, body={**body, "max_tokens": room})
