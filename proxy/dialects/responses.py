"""POST .../v1/responses: the OpenAI Responses API (Codex CLI), served by the engine's chat."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiohttp import web

from ...store import CallDialect
from . import responses_request
from .dialect import Answer, ChatPlan
from .responses_render import ResponsesRenderer
from .serve import serve
from .translated import Translated


class ResponsesTranslation:
    kind = CallDialect.RESPONSES

    def plan(self, body: dict[str, Any]) -> ChatPlan:
        return responses_request.plan(body)

    def purpose(self, body: dict[str, Any], headers: Mapping[str, str]) -> str | None:
        # Codex names its side calls itself (x-openai-subagent, read at intake).
        return None

    def renderer(self, body: dict[str, Any], answer: Answer) -> ResponsesRenderer:
        return ResponsesRenderer(body, answer)


_RESPONSES = Translated(ResponsesTranslation())


async def responses(request: web.Request) -> web.StreamResponse:
    return await serve(request, _RESPONSES)
