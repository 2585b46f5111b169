"""Open one engine response for a call, failing over to another backend before the first byte."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass

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


@dataclass
class Upstream:
    backend: Backend
    response: aiohttp.ClientResponse
    prepared: Prepared

    def release(self, *, abort: bool = False) -> None:
        """Let go of the engine. Aborting closes the connection, which cancels the request."""
        if abort:
            self.response.close()
        else:
            self.response.release()
        self.backend.inflight -= 1


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
        at = now()
        try:
            response = await session.post(
                backend.endpoint(prepared.path or path),
                data=engine_request,
                headers=headers,
                timeout=timeout,
            )
        except (TimeoutError, aiohttp.ClientConnectionError) as e:
            backend.inflight -= 1
            exchange.tried(at)
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
            exchange.sent(at, backend.url, engine_request)
            raise
        if response.status in _RETRY_ELSEWHERE:
            response.close()
            backend.inflight -= 1
            exchange.tried(at)
            pool.mark_failed(backend)
            tried.add(backend.url)
            last_error = f"{backend.url}: HTTP {response.status}"
            continue
        exchange.sent(at, backend.url, engine_request)
        backend.served += 1
        return Upstream(backend, response, prepared)


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
