"""Around every engine call, whatever the client's dialect: the pause gate, dispatch with
failover, recording a failure to dispatch, and the metrics once the call is over."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
from aiohttp import web

from rolltap.proxy.call import EngineCall
from rolltap.proxy.errors import ProxyError
from rolltap.proxy.exchange import now
from rolltap.proxy.intake import Intake
from rolltap.store import CallStatus


@contextlib.asynccontextmanager
async def engine_call(taken: Intake, body: dict[str, Any]) -> AsyncIterator[EngineCall]:
    """An opened EngineCall: `error` set if the engine refused, else ready to read."""
    ctx, exchange = taken.ctx, taken.exchange
    exchange.weight_version = await ctx.gate.enter()
    call = EngineCall(ctx, exchange, body)
    try:
        try:
            await call.open()
        except ProxyError as e:
            exchange.fail(CallStatus.FAILED, e.status, e.message)
            await ctx.record(exchange, taken.state)
            ctx.metrics.errors.inc(kind=e.code or e.type)
            raise
        yield call
    finally:
        call.close()
        ctx.gate.leave()
        observe_call(taken)


async def write_last(response: web.StreamResponse, data: bytes) -> None:
    try:
        await response.write(data)
        await response.write_eof()
    except ConnectionResetError:
        pass


def error_message(body: bytes) -> str:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body[:300].decode(errors="replace")
    error = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])[:1000]
    return body[:300].decode(errors="replace")


def observe_call(taken: Intake) -> None:
    exchange = taken.exchange
    metrics = taken.ctx.metrics
    finished = exchange.finished_at or now()
    total = (finished - exchange.received_at).total_seconds()
    metrics.latency.observe(total, dialect=exchange.dialect.value)
    if exchange.first_token_at is not None and exchange.stream:
        metrics.ttft.observe((exchange.first_token_at - exchange.received_at).total_seconds())
    if exchange.dispatched_at is not None and exchange.upstream_done is not None:
        before = (exchange.dispatched_at - exchange.received_at).total_seconds()
        after = time.perf_counter() - exchange.upstream_done
        metrics.overhead.observe(before + after, dialect=exchange.dialect.value)
