"""What every LLM request goes through before its dialect's handler: identity, body, retries."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from ..store import CallDialect, CallStatus, StoreState
from ..store.events import BudgetExceeded
from ..store.lifecycle import status_of
from ..store.store import FINAL_STATUSES
from .context import CONTEXT, ProxyContext
from .control.stale_hold import hold_bound
from .errors import BadRequest, PayloadTooLarge, ProxyError
from .middleware import Handler, store_unavailable
from .rollouts import Rollouts, RolloutState
from .upstream import routed
from .upstream.exchange import PURPOSE_HEADERS, RETRY_HEADER, Exchange, now


@dataclass
class Intake:
    """One call as the proxy took it in; the `Leg` its engine side is run with (upstream/leg.py)."""

    ctx: ProxyContext
    state: RolloutState
    exchange: Exchange
    reserved: bool = False
    """The call holds a budget reservation, settled by its record or released at the end."""

    def release(self) -> None:
        """The request is over: a reservation its record did not settle is given back."""
        if self.reserved:
            self.state.budget.release(self.exchange.call_id)
            self.reserved = False

    async def record(self, exchange: Exchange) -> None:
        await self.ctx.recorder.record(exchange, self.state)

    async def bound(self) -> None:
        await hold_bound(self.ctx, self.state)

    async def reject(self, error: ProxyError) -> ProxyError:
        """Record the refused request (one row per request received), then hand the error back."""
        self.exchange.reject(error)
        await self.record(self.exchange)
        self.ctx.metrics.errors.inc(kind=error.code or error.type)
        return error


INTAKE = web.RequestKey("rolltap_intake", Intake)


@web.middleware
async def release_at_end(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Whatever way a request ends, a budget reservation its record did not settle goes back."""
    try:
        return await handler(request)
    finally:
        taken = request.get(INTAKE)
        if taken is not None:
            taken.release()


async def intake(request: web.Request, dialect: CallDialect) -> Intake:
    ctx = request.app[CONTEXT]
    received = now()
    purpose = next(
        (request.headers[h][:40] for h in PURPOSE_HEADERS if request.headers.get(h)), None
    )
    retries = _int_header(request, RETRY_HEADER)
    # An unknown key answers 401 and is never attributed to any rollout.
    state = await ctx.rollouts.resolve_request(request)
    if not ctx.store.accepting():
        # Refused before anything reaches an engine, so no sampled tokens wait on a full queue.
        # Not recorded: that record would need the very queue that is full (metrics count it).
        status = ctx.store.status()
        full = status.state is StoreState.FULL
        ctx.metrics.errors.inc(kind="store_full" if full else "store_unavailable")
        raise store_unavailable(status.reason, status)
    try:
        raw_body: bytes | None = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raw_body = None
    exchange = Exchange.received(state.id, dialect, received, raw_body, retries, purpose)
    taken = Intake(ctx, state, exchange)
    request[INTAKE] = taken
    if raw_body is None:
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
    """Finished rollouts and budgets (proxy/budget.py); a spent budget ends the rollout with its
    own status, whether it was running or had not started yet."""
    state, exchange = taken.state, taken.exchange
    asked, n = _generation_limit(exchange, taken.ctx.settings.max_tokens_cap)
    try:
        served = _served_model(taken.ctx, exchange)
        routed_experts = _routed_experts(taken.ctx, state)
        while True:
            Rollouts.admit(state)
            admission = state.budget.try_reserve(
                state.id, exchange.call_id, asked, n, prompt_estimate=len(exchange.raw_body or b"")
            )
            if admission is not None:
                break
            # Only the reservations of calls in flight stand in the way: wait for one to settle.
            await state.budget.settled()
    except ProxyError as e:
        if e.code == "rollout_budget_exceeded" and state.status not in FINAL_STATUSES:
            spent = BudgetExceeded(e.message)
            state.status = status_of(spent)
            await taken.ctx.store.report(state.id, spent)
        raise await taken.reject(e) from None
    taken.reserved = True
    exchange.admitted(served, admission.allowance, routed_experts)


def _routed_experts(ctx: ProxyContext, state: RolloutState) -> bool:
    """Whether the call asks for routed experts (proxy/upstream/routed.py); refused where the
    engines cannot give them."""
    chosen = state.routed_experts
    if not (ctx.settings.capture_routed_experts if chosen is None else chosen):
        return False
    kinds = (b.kind for b in ctx.pool.all())
    reason = routed.refusal(kinds, ctx.settings.builtin_engine)
    if reason is not None:
        raise BadRequest(reason, code="routed_experts_unavailable")
    return True


def _served_model(ctx: ProxyContext, exchange: Exchange) -> str | None:
    """The model the engine is asked for, where an alias maps the asked one to another."""
    model = exchange.asked.model
    served = ctx.names.resolve(model)
    return served if served != model else None


# Where each dialect's request says how many tokens it may generate (and how many choices).
_LIMIT_KEYS = {
    CallDialect.CHAT: ("max_completion_tokens", "max_tokens"),
    CallDialect.RESPONSES: ("max_output_tokens",),
    CallDialect.MESSAGES: ("max_tokens",),
}


def _generation_limit(exchange: Exchange, cap: int | None) -> tuple[int | None, int]:
    """(tokens per choice the call may generate, choices) as the engine will be asked."""
    body = exchange.asked.body or {}
    asked = next(
        (body[k] for k in _LIMIT_KEYS[exchange.dialect] if isinstance(body.get(k), int)), None
    )
    if cap is not None:
        asked = cap if asked is None else min(asked, cap)
    n = body.get("n") if exchange.dialect is CallDialect.CHAT else None
    return asked, n if isinstance(n, int) and n > 0 else 1


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
    drawing = taken.state.drawing.get(digest)
    if drawing is not None and exchange.retry_count > 0:
        # The call it repeats is still being sampled (proxy/replay/retries.py waits for it).
        exchange.retries(drawing[0])
        return
    found = taken.state.bodies.get(digest)
    if found is None and taken.state.calls_before > 0:
        # Calls from before this process (a restarted proxy): the store knows them.
        found = await taken.ctx.store.latest_call_with_body(exchange.rollout_id, digest)
    if found is None:
        return
    call_id, status = found
    if exchange.retry_count > 0 or status != CallStatus.OK.value:
        exchange.retries(call_id)


def _int_header(request: web.Request, name: str) -> int:
    with contextlib.suppress(ValueError):
        return max(0, int(request.headers.get(name, "0")))
    return 0
