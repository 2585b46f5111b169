"""The one flow of an LLM call, for every client dialect: Chat Completions, Responses, Messages.

    intake -> read (the dialect validates; refused: recorded, the client's error shape)
           -> admit (budgets) -> link a retry -> the engine's request (the dialect's)
           -> the answer (engine, token-in or replay: answers.py)
           -> relay (hold, failover, capture, record) rendered as the dialect's client sees it

A dialect (dialect.py `Dialect`) is what differs: how its request is checked and what it asks
of the engine, and how the engine's answer looks to its client. Chat Completions is one dialect
among the three; that the engines also speak it only means its request goes out as it came.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ..answers import engine_answer
from ..errors import ProxyError
from ..intake import admit, intake, link_retry, parse_json_object
from ..upstream.relay import relay
from .dialect import Dialect


async def serve(request: web.Request, dialect: Dialect[Any]) -> web.StreamResponse:
    taken = await intake(request, dialect.kind)
    exchange = taken.exchange
    try:
        body = parse_json_object(exchange.raw_body)
        plan = dialect.read(body)
    except ProxyError as e:
        raise await taken.reject(e) from None
    exchange.understood(body, dialect.purpose(body, request.headers))
    exchange.notes.extend(dialect.notes(plan))
    await admit(taken)
    await link_retry(taken)
    engine_request = await dialect.engine_request(taken, plan)
    rendering = dialect.rendering(taken, body)
    call = await engine_answer(request, taken, engine_request)
    return await relay(request, taken, call, rendering)
