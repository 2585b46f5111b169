"""A fake LLM server for harness tests: a real aiohttp app on loopback that speaks Chat
Completions (JSON and SSE), Responses SSE and Anthropic Messages SSE, answers from a short script
and records every request it sees.

The reply to a request depends only on the request (stateless): the number of tool results already
in its conversation picks the script step, and a request that offers no tools (a title or other side
call) gets plain text. Retries, side calls and sub-agents therefore cannot desynchronise the script.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass(frozen=True)
class Call:
    """Ask the harness to run one tool."""

    name: str
    arguments: Mapping[str, Any]


@dataclass(frozen=True)
class Say:
    """Answer with text and no tool call: most harnesses take that as the end of the episode."""

    text: str


@dataclass(frozen=True)
class Fail:
    """Answer with an HTTP error in the dialect's error shape."""

    status: int = 404
    message: str = "model not found"


Action = Call | Say | Fail


@dataclass(frozen=True)
class Seen:
    """One request as it arrived."""

    method: str
    path: str
    query: str
    headers: Mapping[str, str]
    body: Any


@dataclass
class ScriptedLLM:
    script: Sequence[Action]
    side_reply: str = "Greeting"
    side_failure: Fail | None = None
    """Answer calls without tools (side calls, single-call) with this error instead."""
    model: str = "scripted-model"
    seen: list[Seen] = field(default_factory=list)
    _ids: itertools.count[int] = field(default_factory=itertools.count)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024**2)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        return app

    def posts(self, suffix: str) -> list[Seen]:
        return [s for s in self.seen if s.method == "POST" and s.path.endswith(suffix)]

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace")
        self.seen.append(
            Seen(request.method, request.path, request.query_string, dict(request.headers), body)
        )
        path = request.path
        if request.method in ("HEAD", "GET") and path.endswith("/api/hello"):
            return web.Response()
        if request.method == "GET" and path.endswith("/models"):
            return web.json_response(self._models())
        if request.method != "POST" or not isinstance(body, dict):
            return web.json_response({"error": {"message": f"no route {path}"}}, status=404)
        if path.endswith("/chat/completions"):
            return await self._chat(request, body)
        if path.endswith("/responses"):
            return await self._responses(request, body)
        if path.endswith("/messages/count_tokens"):
            return web.json_response({"input_tokens": len(json.dumps(body)) // 4})
        if path.endswith("/messages"):
            return await self._messages(request, body)
        return web.json_response({"error": {"message": f"no route {path}"}}, status=404)

    def _action(self, has_tools: bool, tool_results: int) -> Action:
        if not has_tools:
            return self.side_failure or Say(self.side_reply)
        if tool_results < len(self.script):
            return self.script[tool_results]
        return Say("Done.")

    def _next_id(self, prefix: str) -> str:
        return f"{prefix}_{next(self._ids)}"

    def _models(self) -> dict[str, Any]:
        # One list that satisfies both the OpenAI and the Anthropic model-list shapes.
        entry = {
            "id": self.model,
            "object": "model",
            "type": "model",
            "created": 0,
            "created_at": "2026-01-01T00:00:00Z",
            "owned_by": "rolltap-tests",
            "display_name": self.model,
        }
        return {
            "object": "list",
            "data": [entry],
            "has_more": False,
            "first_id": self.model,
            "last_id": self.model,
        }

    # Chat Completions

    async def _chat(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        messages = body.get("messages") or []
        results = sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "tool")
        action = self._action(bool(body.get("tools")), results)
        if isinstance(action, Fail):
            return _openai_error(action)
        cid = self._next_id("chatcmpl")
        usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        if isinstance(action, Call):
            call = {
                "id": self._next_id("call"),
                "type": "function",
                "function": {"name": action.name, "arguments": json.dumps(action.arguments)},
            }
            message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [call]}
            finish = "tool_calls"
        else:
            message = {"role": "assistant", "content": action.text}
            finish = "stop"
        if not body.get("stream"):
            return web.json_response(
                {
                    "id": cid,
                    "object": "chat.completion",
                    "created": 0,
                    "model": body.get("model", self.model),
                    "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                    "usage": usage,
                }
            )

        def chunk(choices: list[Any], **extra: Any) -> dict[str, Any]:
            base = {"id": cid, "object": "chat.completion.chunk", "created": 0}
            return {**base, "model": body.get("model", self.model), "choices": choices, **extra}

        frames = [chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}}])]
        if isinstance(action, Call):
            call = message["tool_calls"][0]
            head = {**call, "index": 0, "function": {**call["function"], "arguments": ""}}
            tail = {"index": 0, "function": {"arguments": call["function"]["arguments"]}}
            frames.append(chunk([{"index": 0, "delta": {"tool_calls": [head]}}]))
            frames.append(chunk([{"index": 0, "delta": {"tool_calls": [tail]}}]))
        else:
            frames.append(chunk([{"index": 0, "delta": {"content": action.text}}]))
        frames.append(chunk([{"index": 0, "delta": {}, "finish_reason": finish}]))
        if (body.get("stream_options") or {}).get("include_usage"):
            frames.append(chunk([], usage=usage))
        lines = [f"data: {json.dumps(f)}\n\n" for f in frames] + ["data: [DONE]\n\n"]
        return await _sse(request, lines)

    # Responses (Codex)

    async def _responses(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        items = body.get("input") or []
        results = sum(
            1
            for i in items
            if isinstance(i, dict)
            and i.get("type") in ("function_call_output", "custom_tool_call_output")
        )
        action = self._action(bool(body.get("tools")), results)
        if isinstance(action, Fail):
            return _openai_error(action)
        rid = self._next_id("resp")
        if isinstance(action, Call):
            item: dict[str, Any] = {
                "type": "function_call",
                "id": self._next_id("fc"),
                "call_id": self._next_id("call"),
                "name": action.name,
                "arguments": json.dumps(action.arguments),
                "status": "completed",
            }
        else:
            text = {"type": "output_text", "text": action.text, "annotations": []}
            item = {
                "type": "message",
                "id": self._next_id("msg"),
                "role": "assistant",
                "status": "completed",
                "content": [text],
            }
        usage = {
            "input_tokens": 10,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 5,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 15,
        }
        response = {"id": rid, "object": "response", "status": "in_progress", "output": []}
        events: list[dict[str, Any]] = [
            {"type": "response.created", "response": response},
            {"type": "response.output_item.added", "output_index": 0, "item": item},
        ]
        if not isinstance(action, Call):
            events.append(
                {
                    "type": "response.output_text.delta",
                    "item_id": item["id"],
                    "output_index": 0,
                    "content_index": 0,
                    "delta": action.text,
                }
            )
        done = {**response, "status": "completed", "output": [item], "usage": usage}
        events += [
            {"type": "response.output_item.done", "output_index": 0, "item": item},
            {"type": "response.completed", "response": done},
        ]
        lines = [
            f"event: {e['type']}\ndata: {json.dumps({**e, 'sequence_number': n})}\n\n"
            for n, e in enumerate(events)
        ]
        return await _sse(request, lines)

    # Anthropic Messages (Claude Code)

    async def _messages(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        results = sum(
            1
            for m in body.get("messages") or []
            if isinstance(m, dict) and isinstance(m.get("content"), list)
            for block in m["content"]
            if isinstance(block, dict) and block.get("type") == "tool_result"
        )
        action = self._action(bool(body.get("tools")), results)
        if isinstance(action, Fail):
            error = {"type": "not_found_error", "message": action.message}
            return web.json_response({"type": "error", "error": error}, status=action.status)
        model = body.get("model", self.model)
        usage = {"input_tokens": 10, "output_tokens": 5}
        if isinstance(action, Call):
            tool_use = {"type": "tool_use", "id": self._next_id("toolu"), "name": action.name}
            block: dict[str, Any] = {**tool_use, "input": dict(action.arguments)}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(action.arguments)}
            start = {**tool_use, "input": {}}
            stop = "tool_use"
        else:
            block = {"type": "text", "text": action.text}
            delta = {"type": "text_delta", "text": action.text}
            start = {"type": "text", "text": ""}
            stop = "end_turn"
        message = {
            "id": self._next_id("msg"),
            "type": "message",
            "role": "assistant",
            "model": model,
            "stop_sequence": None,
        }
        if not body.get("stream"):
            return web.json_response(
                {**message, "content": [block], "stop_reason": stop, "usage": usage}
            )
        events: list[dict[str, Any]] = [
            {
                "type": "message_start",
                "message": {**message, "content": [], "stop_reason": None, "usage": usage},
            },
            {"type": "content_block_start", "index": 0, "content_block": start},
            {"type": "content_block_delta", "index": 0, "delta": delta},
            {"type": "content_block_stop", "index": 0},
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop, "stop_sequence": None},
                "usage": {"output_tokens": 5},
            },
            {"type": "message_stop"},
        ]
        lines = [f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events]
        return await _sse(request, lines)


def _openai_error(fail: Fail) -> web.Response:
    error = {"message": fail.message, "type": "invalid_request_error", "code": str(fail.status)}
    return web.json_response({"error": error}, status=fail.status)


async def _sse(request: web.Request, frames: Sequence[str]) -> web.StreamResponse:
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    for frame in frames:
        await response.write(frame.encode())
    await response.write_eof()
    return response


@asynccontextmanager
async def serve(llm: ScriptedLLM) -> AsyncIterator[str]:
    """Run `llm` on 127.0.0.1 (a free port) and yield its root URL, e.g. http://127.0.0.1:41234."""
    runner = web.AppRunner(llm.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
