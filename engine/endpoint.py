"""What every route shares: the engine slot, JSON in and out, model and request-id checks."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from .core import Engine
from .errors import BadRequest, NotFound, PayloadTooLarge, Unavailable


@dataclass
class EngineSlot:
    """Holds the engine once loaded; routes answer 503 until then."""

    served_name: str
    engine: Engine | None = None
    started: float = 0.0
    weights_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Held by a weight update from reading the files to the swap: one at a time."""
    paused: bool = False
    """Paused through vLLM's `/pause` until `/resume` (engine/control.py)."""


SLOT = web.AppKey("slot", EngineSlot)


def json_response(
    body: Any, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    return web.Response(
        body=orjson.dumps(body), status=status, content_type="application/json", headers=headers
    )


def ready_engine(request: web.Request) -> Engine:
    engine = request.app[SLOT].engine
    if engine is None:
        raise Unavailable("the model is still loading")
    return engine


def check_model(engine: Engine, model: str | None) -> None:
    if model is not None and model != engine.name:
        # vLLM's words, then what is served: the fix is usually a copy of it.
        raise NotFound(
            f"The model `{model}` does not exist. Served: `{engine.name}`.", param="model"
        )


async def read_json(request: web.Request) -> Any:
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge as e:
        raise PayloadTooLarge("the request body is too large") from e
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise BadRequest(f"malformed JSON body: {e}") from e


def request_id(request: web.Request, body_id: str | None) -> str:
    """The caller's id (header X-Request-Id wins over body request_id, as in vLLM) or a new one."""
    return request.headers.get("X-Request-Id") or body_id or uuid.uuid4().hex
