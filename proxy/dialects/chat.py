"""POST .../v1/chat/completions: the Chat Completions dialect of the one call flow (serve.py).

Its request, once checked, goes to the engine as it came (the engines speak it too);
`ChatRendering` is how a chat client sees the answer: as the engine sent it, less what rolltap
asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import orjson
from aiohttp import web

from ...store import CallDialect
from ..errors import BadRequest, Unprocessable
from ..intake import Intake
from ..upstream.assemble import ChatAssembler
from ..upstream.call import Chunk
from ..upstream.relay import EngineAnswer
from ..upstream.sse import frame
from .dialect import expect
from .serve import serve
from .strip import strip, strip_chunk

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


class ChatDialect:
    """Chat Completions: the request is checked, then sent to the engine as the client wrote it."""

    kind = CallDialect.CHAT

    def read(self, body: dict[str, Any]) -> dict[str, Any]:
        validate_chat(body)
        return body

    def purpose(self, body: dict[str, Any], headers: Mapping[str, str]) -> str | None:
        return None  # side calls name themselves in headers (read at intake)

    def notes(self, plan: dict[str, Any]) -> list[str]:
        return []

    async def engine_request(self, taken: Intake, plan: dict[str, Any]) -> dict[str, Any]:
        return plan

    def rendering(
        self, taken: Intake, body: dict[str, Any]
    ) -> Callable[[EngineAnswer], ChatRendering]:
        return ChatRendering


_CHAT = ChatDialect()


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await serve(request, _CHAT)


class ChatRendering:
    """Chat answers go out as the engine sent them, less what rolltap asked for (strip.py)."""

    def __init__(self, call: EngineAnswer) -> None:
        prepared = call.prepared
        self._extras = prepared.extras
        self._client_usage = prepared.usage_chunk_for_client
        self._choices = int(prepared.body.get("n") or 1)
        self._finished: set[int] = set()
        self._assembler = ChatAssembler(keep_logprobs=not self._extras.logprobs)
        self._held: list[bytes] = []
        """From the chunk that ends the last choice on: sent once the call is recorded."""

    def refused(self, status: int, body: bytes) -> bytes:
        return body  # the engine's own error body reaches the client as sent

    def whole(self, raw: bytes, doc: dict[str, Any]) -> bytes:
        return strip(raw, doc, self._extras)

    def feed(self, chunk: Chunk) -> bytes:
        doc = chunk.doc
        if rolltap_only(doc, self._client_usage):
            return b""
        self._assembler.feed(doc)
        out = frame(strip_chunk(chunk.raw, doc, self._extras))
        if self._held or self._ends(doc):
            self._held.append(out)
            return b""
        return out

    def ending(self) -> bytes:
        return b"".join(self._held) + b"data: [DONE]\n\n"

    def failure(self) -> bytes:
        error = {
            "error": {
                "message": "the backend failed mid-stream",
                "type": "upstream_error",
                "param": None,
                "code": 502,
            }
        }
        return frame(orjson.dumps(error))

    def recorded(self) -> bytes:
        return orjson.dumps(self._assembler.result())

    def _ends(self, doc: dict[str, Any]) -> bool:
        """Whether this chunk ends the answer: the last choice's finish_reason, or usage."""
        choices = doc.get("choices")
        if not choices:
            return "usage" in doc
        for choice in choices:
            if choice.get("finish_reason") is not None:
                self._finished.add(int(choice.get("index") or 0))
        return len(self._finished) >= self._choices


def rolltap_only(doc: dict[str, Any], client_wants_usage: bool) -> bool:
    """Chunks that exist only because rolltap asked: the usage chunk, SGLang's ids chunk."""
    if doc.get("choices"):
        return False
    if "sglext" in doc:
        return True
    return "usage" in doc and not client_wants_usage
