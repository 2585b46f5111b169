"""POST .../v1/chat/completions: relay to the engine, capture ids, record, answer as it did."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from aiohttp import web

from rolltap.proxy.assemble import ChatAssembler
from rolltap.proxy.call import EngineBroke, EngineCall
from rolltap.proxy.dialect import expect
from rolltap.proxy.dispatch import engine_call, error_message, write_last
from rolltap.proxy.errors import BadRequest, ProxyError, Unprocessable, UpstreamFailed
from rolltap.proxy.exchange import now
from rolltap.proxy.intake import Intake, admit, intake, link_retry, parse_json_object
from rolltap.proxy.sse import frame
from rolltap.proxy.strip import strip, strip_chunk
from rolltap.store import CallDialect, CallStatus

_UNSUPPORTED = {
    "functions": "legacy 'functions' is not supported; send 'tools'",
    "function_call": "legacy 'function_call' is not supported; send 'tool_choice'",
    "audio": "audio output is not supported",
    "prediction": "predicted outputs are not supported",
}


def validate_chat(body: dict[str, Any]) -> None:
    """Types and values an OpenAI-compatible engine would refuse, refused here first."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty array", param="messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise BadRequest(f"messages[{i}] must be an object with a 'role'", param="messages")
    expect(body, "model", str)
    expect(body, "stream", bool)
    expect(body, "logprobs", bool)
    expect(body, "tools", list)
    expect(body, "stream_options", dict)
    expect(body, "stop", (str, list))
    expect(body, "tool_choice", (str, dict))
    for key in ("temperature", "top_p", "presence_penalty", "frequency_penalty"):
        expect(body, key, (int, float))
    for key in ("n", "max_tokens", "max_completion_tokens", "top_logprobs", "seed", "top_k"):
        expect(body, key, int)
    n = body.get("n")
    if n is not None and not 1 <= n <= 128:
        raise BadRequest("'n' must be between 1 and 128", param="n")
    for key in ("max_tokens", "max_completion_tokens"):
        if body.get(key) is not None and body[key] < 1:
            raise BadRequest(f"'{key}' must be at least 1", param=key)
    if body.get("tools") is not None:
        for i, tool in enumerate(body["tools"]):
            if not isinstance(tool, dict):
                raise BadRequest(f"tools[{i}] must be an object", param="tools")
    for key, message in _UNSUPPORTED.items():
        if body.get(key) is not None:
            raise Unprocessable(message, param=key, code="unsupported_parameter")
    modalities = body.get("modalities")
    if isinstance(modalities, list) and "audio" in modalities:
        raise Unprocessable("audio output is not supported", param="modalities")


async def chat_completions(request: web.Request) -> web.StreamResponse:
    taken = await intake(request, CallDialect.CHAT)
    exchange = taken.exchange
    try:
        body = parse_json_object(exchange.raw_body)
        validate_chat(body)
    except ProxyError as e:
        raise await taken.reject(e) from None
    exchange.body = body
    exchange.stream = body.get("stream") is True
    exchange.model = body.get("model")
    await admit(taken)
    await link_retry(taken)
    async with engine_call(taken, body) as call:
        if call.error is not None:
            return await _engine_error(taken, call)
        if exchange.stream:
            return await _relay_stream(request, taken, call)
        return await _relay_body(taken, call)


async def _engine_error(taken: Intake, call: EngineCall) -> web.Response:
    """The engine refused the request itself: its own error body reaches the client as sent."""
    assert call.error is not None
    exchange = taken.exchange
    exchange.response_body = call.error.body
    exchange.fail(CallStatus.FAILED, call.error.status, error_message(call.error.body))
    await taken.ctx.record(exchange, taken.state)
    taken.ctx.metrics.errors.inc(kind=f"engine_{call.error.status}")
    return web.Response(
        status=call.error.status, body=call.error.body, content_type="application/json"
    )


async def _relay_body(taken: Intake, call: EngineCall) -> web.Response:
    exchange = taken.exchange
    try:
        raw, doc = await call.read_body()
    except EngineBroke as e:
        exchange.fail(CallStatus.FAILED, 502, f"engine failed while answering: {e}")
        await taken.ctx.record(exchange, taken.state)
        raise UpstreamFailed(f"the backend failed while answering: {e}") from None
    out = strip(raw, doc, call.prepared.extras)
    exchange.response_body = out
    exchange.http_status = 200
    exchange.finished_at = now()
    await taken.ctx.record(exchange, taken.state)
    return web.Response(body=out, content_type="application/json")


async def _relay_stream(
    request: web.Request, taken: Intake, call: EngineCall
) -> web.StreamResponse:
    exchange = taken.exchange
    extras = call.prepared.extras
    assembler = ChatAssembler(keep_logprobs=not extras.logprobs)
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    client_usage = call.prepared.usage_chunk_for_client
    try:
        async for batch in call.chunks():
            out = []
            for chunk in batch:
                if rolltap_only(chunk.doc, client_usage):
                    continue
                assembler.feed(chunk.doc)
                out.append(frame(strip_chunk(chunk.raw, chunk.doc, extras)))
            if out:
                await response.write(b"".join(out))
    except EngineBroke as e:
        exchange.response_body = orjson.dumps(assembler.result())
        exchange.fail(CallStatus.FAILED, 502, f"engine stream broke: {e}")
        await taken.ctx.record(exchange, taken.state)
        taken.ctx.metrics.errors.inc(kind="engine_stream_broke")
        error = {
            "error": {
                "message": "the backend failed mid-stream",
                "type": "upstream_error",
                "param": None,
                "code": 502,
            }
        }
        await write_last(response, frame(orjson.dumps(error)))
        return response
    except (ConnectionResetError, asyncio.CancelledError):
        # The client went away: stop the engine and keep what was sampled, marked cancelled.
        call.close()
        exchange.response_body = orjson.dumps(assembler.result())
        exchange.fail(CallStatus.CANCELLED, None, "client disconnected mid-stream")
        await asyncio.shield(taken.ctx.record(exchange, taken.state))
        return response
    exchange.response_body = orjson.dumps(assembler.result())
    exchange.http_status = 200
    exchange.finished_at = now()
    await taken.ctx.record(exchange, taken.state)
    await write_last(response, b"data: [DONE]\n\n")
    return response


def rolltap_only(doc: dict[str, Any], client_wants_usage: bool) -> bool:
    """Chunks that exist only because rolltap asked: the usage chunk, SGLang's ids chunk."""
    if doc.get("choices"):
        return False
    if "sglext" in doc:
        return True
    return "usage" in doc and not client_wants_usage
