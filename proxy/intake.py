"""What every LLM request goes through before its dialect's handler: identity, body, retries."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from rolltap.proxy.context import CONTEXT, ProxyContext
from rolltap.proxy.errors import BadRequest, PayloadTooLarge, ProxyError
from rolltap.proxy.exchange import PURPOSE_HEADERS, RETRY_HEADER, Exchange, now
from rolltap.proxy.rollouts import Rollouts, RolloutState, request_key
from rolltap.store import CallDialect, CallStatus, RolloutStatus


@dataclass
class Intake:
    ctx: ProxyContext
    state: RolloutState
    exchange: Exchange

    async def reject(self, error: ProxyError) -> ProxyError:
        """Record the refused request (one row per request received), then hand the error back."""
        self.exchange.reject(error)
        await self.ctx.record(self.exchange, self.state)
        self.ctx.metrics.errors.inc(kind=error.code or error.type)
        return error


async def intake(request: web.Request, dialect: CallDialect) -> Intake:
    ctx = request.app[CONTEXT]
    received = now()
    # An unknown key answers 401 and is never attributed to any rollout.
    state = await ctx.rollouts.resolve(request_key(request))
    exchange = Exchange(state.id, dialect, received, raw_body=None)
    exchange.retry_count = _int_header(request, RETRY_HEADER)
    for header in PURPOSE_HEADERS:
        if request.headers.get(header):
            exchange.purpose = request.headers[header][:40]
            break
    taken = Intake(ctx, state, exchange)
    try:
        exchange.raw_body = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise await taken.reject(
            PayloadTooLarge(
                f"request body over the proxy's limit of {ctx.settings.max_body_bytes} bytes",
                code="request_too_large",
            )
        ) from None
    return taken


def parse_json_object(raw: bytes | None) -> dict[str, Any]:
    try:
        body = orjson.loads(raw or b"")
    except orjson.JSONDecodeError as e:
        raise BadRequest(f"request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object", code="invalid_json")
    return body


async def admit(taken: Intake) -> None:
    """Budgets and finished rollouts; a spent budget ends the rollout with its own status."""
    state = taken.state
    try:
        Rollouts.admit(state)
    except ProxyError as e:
        if taken.ctx.rollouts.budget_exhausted(state) and state.status is RolloutStatus.RUNNING:
            state.status = RolloutStatus.BUDGET_EXCEEDED
            await taken.ctx.store.update_rollout(
                state.id, status=RolloutStatus.BUDGET_EXCEEDED, error=e.message
            )
        raise await taken.reject(e) from None


async def link_retry(taken: Intake) -> None:
    """A retried request points at the call it repeats instead of counting as a new turn.

    It is a retry when the SDK says so (x-stainless-retry-count > 0) and an earlier call had the
    same body, or when the latest call with the same body did not succeed. Equal bodies alone
    never make a retry: resampling the same prompt is legitimate.
    """
    exchange = taken.exchange
    digest = exchange.body_hash
    if digest is None:
        return
    found = taken.state.bodies.get(digest)
    if found is None and taken.state.calls_before > 0:
        # Calls from before this process (a restarted proxy): the store knows them.
        found = await taken.ctx.store.latest_call_with_body(exchange.rollout_id, digest)
    if found is None:
        return
    call_id, status = found
    if exchange.retry_count > 0 or status != CallStatus.OK.value:
        exchange.retry_of = call_id


def _int_header(request: web.Request, name: str) -> int:
    with contextlib.suppress(ValueError):
        return max(0, int(request.headers.get(name, "0")))
    return 0
