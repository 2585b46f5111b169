"""POST .../v1/messages (Anthropic Messages, Claude Code), its count_tokens, and the start probe.

count_tokens renders the request as the engine would see it: the translated chat messages and
tools go to the backend's `/tokenize` (vLLM's dialect; rolltap's engine has it), and its count is
the answer. A backend without it (plain OpenAI-compatible, or one that refuses), or no backend
at all (a replaying proxy), gets an estimate: a quarter of the UTF-8 bytes of the translated
messages and tools, at least 1.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from ...store import CallDialect
from ..context import CONTEXT
from ..intake import parse_json_object
from ..rollouts import Rollouts
from ..upstream.engines import EngineKind
from . import messages_request
from .dialect import Answer, ChatPlan
from .messages_render import MessagesRenderer
from .serve import serve
from .translated import Translated, chat_request

_TOKENIZE_TIMEOUT = aiohttp.ClientTimeout(total=30)


class MessagesTranslation:
    kind = CallDialect.MESSAGES

    def plan(self, body: dict[str, Any]) -> ChatPlan:
        return messages_request.plan(body)

    def purpose(self, body: dict[str, Any], headers: Mapping[str, str]) -> str | None:
        return messages_request.purpose(body, headers)

    def renderer(self, body: dict[str, Any], answer: Answer) -> MessagesRenderer:
        return MessagesRenderer(body, answer)


_MESSAGES = Translated(MessagesTranslation())


async def messages(request: web.Request) -> web.StreamResponse:
    return await serve(request, _MESSAGES)


async def count_tokens(request: web.Request) -> web.Response:
    """Not an LLM call: answered, never recorded, counted against no budget."""
    ctx = request.app[CONTEXT]
    state = await ctx.rollouts.resolve_request(request)
    Rollouts.refuse_revoked(state)
    plan = messages_request.plan(parse_json_object(await request.read()), counting=True)
    chat = await chat_request(ctx, state.id, plan)
    probe: dict[str, Any] = {k: chat[k] for k in ("model", "messages", "tools") if k in chat}
    # A replaying proxy may have no engine at all: then the estimate it is.
    backend = ctx.router.pick(state.id) if ctx.pool.all() else None
    count = None
    if backend is not None and backend.kind is not EngineKind.OPENAI:
        path = "/v1/tokenize" if backend.kind is EngineKind.SGLANG else "/tokenize"
        count = await _tokenize(ctx.client(), backend.endpoint(path), probe)
    if count is None:
        count = max(1, len(orjson.dumps(probe)) // 4)
    return web.json_response({"input_tokens": count})


async def _tokenize(session: aiohttp.ClientSession, url: str, probe: dict[str, Any]) -> int | None:
    body = orjson.dumps({**probe, "add_generation_prompt": True})
    headers = {"Content-Type": "application/json"}
    try:
        async with session.post(url, data=body, headers=headers, timeout=_TOKENIZE_TIMEOUT) as resp:
            if resp.status != 200:
                return None
            doc = orjson.loads(await resp.read())
    except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError):
        return None
    count = doc.get("count") if isinstance(doc, dict) else None
    return count if isinstance(count, int) else None


async def hello(request: web.Request) -> web.Response:
    """Claude Code's start-up probe (HEAD/GET .../api/hello)."""
    return web.Response(status=200)
