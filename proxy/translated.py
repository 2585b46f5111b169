"""POST handlers of dialects served through chat completions (Responses, Messages): one flow.

Intake, budgets and retry links are the chat handler's; then the harness's history is restored
(history.py), the chat request goes through EngineCall (failover, capture, stickiness, the gate),
and the answer is rendered in the client's dialect event by event. The record holds the client's
request, the chat request sent, and the client's response (the whole object for streams).

An answer cut by the proxy's own `max_tokens_cap` (the client allowed more, or set no limit) is
shown to the client as ended normally (`completed`, `end_turn`): the cap bounds what a rollout
costs, and both harnesses treat a truncated answer as a failed turn (Codex) or ask for more
(Claude Code). The recorded choice keeps `finish_reason: length` and the call is noted.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
from aiohttp import web

from rolltap.proxy.assemble import ChatAssembler
from rolltap.proxy.blocks import BlockStream, from_message
from rolltap.proxy.call import EngineBroke, EngineCall
from rolltap.proxy.context import ProxyContext
from rolltap.proxy.dialect import Answer, ChatPlan, Dialect, Ending, Renderer
from rolltap.proxy.dispatch import engine_call, error_message, write_last
from rolltap.proxy.errors import (
    BadRequest,
    Forbidden,
    NotFoundError,
    PayloadTooLarge,
    ProxyError,
    Unauthorized,
    Unprocessable,
    UpstreamFailed,
)
from rolltap.proxy.exchange import Exchange, now
from rolltap.proxy.handles import Handle
from rolltap.proxy.history import HarnessTurn, Restorer, engine_message
from rolltap.proxy.intake import Intake, admit, intake, link_retry, parse_json_object
from rolltap.proxy.middleware import error_body, is_anthropic
from rolltap.proxy.recall import EngineTurn
from rolltap.proxy.sse import frame
from rolltap.store import CallStatus

_BY_STATUS: dict[int, type[ProxyError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFoundError,
    413: PayloadTooLarge,
    422: Unprocessable,
}
_CONTEXT_OVERFLOW = ("maximum context length", "context length is", "prompt is too long")


async def serve(request: web.Request, dialect: Dialect) -> web.StreamResponse:
    taken = await intake(request, dialect.kind)
    exchange = taken.exchange
    try:
        body = parse_json_object(exchange.raw_body)
        plan = dialect.plan(body)
    except ProxyError as e:
        raise await taken.reject(e) from None
    exchange.body = body
    exchange.stream = body.get("stream") is True
    exchange.model = body["model"] if isinstance(body.get("model"), str) else None
    exchange.purpose = exchange.purpose or dialect.purpose(body, request.headers)
    exchange.notes += plan.notes
    await admit(taken)
    await link_retry(taken)
    ctx = taken.ctx
    chat = await chat_request(ctx, taken.state.id, plan, exchange)
    handle = ctx.recall.handles.mint(taken.state.id, exchange.call_id)
    renderer = dialect.renderer(body, Answer(exchange.call_id, int(time.time()), handle))
    async with engine_call(taken, chat) as call:
        if call.error is not None:
            return await _engine_error(request, taken, call.error.status, call.error.body)
        if exchange.stream:
            return await _relay_stream(request, taken, call, renderer)
        return await _relay_body(taken, call, renderer)


async def chat_request(
    ctx: ProxyContext, rollout_id: str, plan: ChatPlan, exchange: Exchange | None = None
) -> dict[str, Any]:
    """The plan's chat request, the harness's assistant turns restored where they can be."""
    restorer = Restorer(rollout_id, ctx.recall.handles)
    turns = [e for e in plan.entries if isinstance(e, HarnessTurn)]
    wanted = list(dict.fromkeys(restorer.valid_handles(turns)))
    if wanted:
        restorer.recalled(await ctx.recall.lookup(rollout_id, wanted))
    messages: list[dict[str, Any]] = []
    position = 0
    for entry in plan.entries:
        if isinstance(entry, HarnessTurn):
            position += 1
            messages.append(restorer.message(entry, position))
        elif entry.get("role") == "tool":
            messages.append({**entry, "tool_call_id": restorer.tool_call_id(entry["tool_call_id"])})
        else:
            messages.append(entry)
    if exchange is not None:
        exchange.notes += restorer.notes
    params = dict(plan.params)
    head = {"model": params.pop("model")} if "model" in params else {}
    return {**head, "messages": messages, **params}


def engine_refusal(status: int, message: str, anthropic: bool) -> ProxyError:
    """The engine's own error status and message, as this proxy's error for the client."""
    error = _BY_STATUS.get(status, ProxyError)(message)
    error.status = status
    if any(marker in message for marker in _CONTEXT_OVERFLOW):
        # The words each harness looks for to compact its history and try again.
        error.code = "context_length_exceeded"
        if anthropic and not message.startswith("prompt is too long"):
            error.message = f"prompt is too long: {message}"
    return error


async def _engine_error(
    request: web.Request, taken: Intake, status: int, body: bytes
) -> web.Response:
    exchange = taken.exchange
    message = error_message(body)
    error = engine_refusal(status, message, is_anthropic(request.path))
    out = error_body(error, is_anthropic(request.path))
    exchange.response_body = out
    exchange.fail(CallStatus.FAILED, status, message)
    await taken.ctx.record(exchange, taken.state)
    taken.ctx.metrics.errors.inc(kind=f"engine_{status}")
    return web.Response(status=status, body=out, content_type="application/json")


async def _relay_body(taken: Intake, call: EngineCall, renderer: Renderer) -> web.Response:
    exchange = taken.exchange
    try:
        _, doc = await call.read_body()
    except EngineBroke as e:
        exchange.fail(CallStatus.FAILED, 502, f"engine failed while answering: {e}")
        await taken.ctx.record(exchange, taken.state)
        raise UpstreamFailed(f"the backend failed while answering: {e}") from None
    choice = _choice(doc)
    message = choice.get("message") or {}
    renderer.start(exchange.prompt_tokens)
    renderer.feed(from_message(message))
    renderer.finish(_ending(call, exchange, choice.get("finish_reason"), choice.get("stop_reason")))
    out = orjson.dumps(renderer.result())
    exchange.notes += renderer.notes
    exchange.response_body = out
    exchange.http_status = 200
    exchange.finished_at = now()
    _remember(taken, message)
    await taken.ctx.record(exchange, taken.state)
    return web.Response(body=out, content_type="application/json")


async def _relay_stream(
    request: web.Request, taken: Intake, call: EngineCall, renderer: Renderer
) -> web.StreamResponse:
    exchange = taken.exchange
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    blocks = BlockStream()
    assembler = ChatAssembler(keep_logprobs=False)
    finish: Any = None
    stop: Any = None
    # Events not yet written: on a failure they go out first, ahead of the failure event.
    events: list[dict[str, Any]] = []
    started = False
    try:
        async for batch in call.chunks():
            if not started:
                events += renderer.start(exchange.prompt_tokens)
                started = True
            for chunk in batch:
                doc = chunk.doc
                if "error" in doc and not doc.get("choices"):
                    raise EngineBroke(f"engine error mid-stream: {error_message(chunk.raw)}")
                assembler.feed(doc)
                for c in doc.get("choices") or ():
                    if int(c.get("index") or 0) != 0:
                        continue
                    events += renderer.feed(blocks.feed(c.get("delta") or {}))
                    finish = c.get("finish_reason") or finish
                    stop = c.get("stop_reason") if c.get("stop_reason") is not None else stop
            if events:
                await response.write(_frames(events))
                events = []
    except EngineBroke as e:
        events += renderer.fail("the backend failed mid-stream", "server_error")
        exchange.response_body = orjson.dumps(renderer.result())
        exchange.fail(CallStatus.FAILED, 502, f"engine stream broke: {e}")
        await taken.ctx.record(exchange, taken.state)
        taken.ctx.metrics.errors.inc(kind="engine_stream_broke")
        await write_last(response, _frames(events))
        return response
    except (ConnectionResetError, asyncio.CancelledError):
        call.close()
        exchange.response_body = orjson.dumps(renderer.result())
        exchange.fail(CallStatus.CANCELLED, None, "client disconnected mid-stream")
        await asyncio.shield(taken.ctx.record(exchange, taken.state))
        return response
    if not started:
        events += renderer.start(exchange.prompt_tokens)
    events += renderer.feed(blocks.finish()) + renderer.finish(
        _ending(call, exchange, finish, stop)
    )
    exchange.notes += renderer.notes
    exchange.response_body = orjson.dumps(renderer.result())
    exchange.http_status = 200
    exchange.finished_at = now()
    choices = assembler.result()["choices"]
    _remember(taken, choices[0]["message"] if choices else {})
    await taken.ctx.record(exchange, taken.state)
    await write_last(response, _frames(events))
    return response


def _frames(events: list[dict[str, Any]]) -> bytes:
    return b"".join(frame(orjson.dumps(e), e["type"]) for e in events)


def _choice(doc: dict[str, Any]) -> dict[str, Any]:
    for choice in doc.get("choices") or ():
        if isinstance(choice, dict) and int(choice.get("index") or 0) == 0:
            return choice
    return {}


def _ending(call: EngineCall, exchange: Exchange, finish: Any, stop: Any) -> Ending:
    usage = exchange.usage or {}
    if finish == "length" and call.capped:
        exchange.notes.append("cut at max_tokens_cap; the client was told the answer ended")
        finish = "stop"
    return Ending(
        finish_reason=finish if isinstance(finish, str) else None,
        stop_reason=stop if isinstance(stop, str | int) else None,
        prompt_tokens=exchange.prompt_tokens or int(usage.get("prompt_tokens") or 0),
        completion_tokens=exchange.completion_tokens or int(usage.get("completion_tokens") or 0),
    )


def _remember(taken: Intake, message: dict[str, Any]) -> None:
    turn = EngineTurn(engine_message(message))
    taken.ctx.recall.remember(taken.state.id, Handle(taken.exchange.call_id, 0), turn)
