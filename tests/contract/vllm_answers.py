"""An engine whose answers are built with vLLM's own response classes and serialized as vLLM's
server does (vllm/entrypoints/openai/{chat_completion,completion}/{api_router,serving}.py, 0.33):

* a whole answer: `JSONResponse(content=response.model_dump())` (starlette's own encoder);
* a chat stream: the first chunk carries the role and `prompt_token_ids`, each token's chunk its
  delta, logprobs and `token_ids`, the last token's chunk also `finish_reason` and `stop_reason`,
  each `model_dump_json(exclude_unset=True, exclude_none=not chunk.choices)`; then the usage
  chunk and `[DONE]`;
* a completions stream: each token's chunk with `token_ids` (the first with `prompt_token_ids`),
  `model_dump_json(exclude_unset=True)`; the usage chunk `exclude_unset=False, exclude_none=True`.

Token ids, the template (`/tokenize`) and the deltas of each token are the fake engine's
(tests/support/fake_vllm.py), so token-in bridges work; the logprobs are irregular floats.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from tests.support.fake_vllm import (
    IM_END,
    MODEL,
    FakeVLLM,
    Reply,
    decode,
    encode,
    generated,
    render,
)

CALL_ID = "chatcmpl-tool-7f3a"


def logprob(position: int) -> float:
    """A logprob no float32 round trip or text formatting leaves as it was, unless exact."""
    return -(position * 0.0371 + 0.001234567891)


@dataclass
class Answered:
    """What the engine sent for one request: its prompt ids, answer ids and logprobs."""

    path: str
    prompt: list[int]
    ids: list[int]
    logprobs: list[float]


@dataclass
class VLLMAnswers:
    """The engine (an aiohttp app); `reply` is what the model says to every chat request."""

    reply: Reply
    completion: Reply = field(default_factory=lambda: Reply(text="done"))
    answered: list[Answered] = field(default_factory=list)
    fake: FakeVLLM = field(default_factory=FakeVLLM)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/tokenize", self.fake.tokenize)
        app.router.add_get("/v1/models", self.fake.models)
        app.router.add_get("/health", self.fake.health)
        return app

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        prompt = render(body["messages"], body.get("tools"))
        transfer = body.get("kv_transfer_params") or {}
        prompt = list(transfer.get("prompt_token_ids") or prompt)
        message = _message(self.reply)
        ids = [*encode(generated(self.reply, self.reply.text)), IM_END]
        self.answered.append(Answered(request.path, prompt, ids, _logprobs(ids)))
        if body.get("stream"):
            return await sse(request, _chat_chunks(prompt, ids, message, body))
        return _json(_chat_whole(prompt, ids, message, body))

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        prompt = list(body["prompt"])
        ids = [*encode(generated(self.completion, self.completion.text)), IM_END]
        self.answered.append(Answered(request.path, prompt, ids, _logprobs(ids)))
        if body.get("stream"):
            return await sse(request, _completion_chunks(prompt, ids, body))
        return _json(_completion_whole(prompt, ids, body))


def _logprobs(ids: list[int]) -> list[float]:
    return [logprob(k) for k in range(len(ids))]


def _message(reply: Reply) -> dict[str, Any]:
    """The parsed answer as the fake's stream splits it (reasoning, content, tool calls)."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.text}
    if reply.reasoning is not None:
        message["reasoning"] = reply.reasoning
    if reply.tool_calls:
        message["content"] = reply.text or None
        message["tool_calls"] = [
            {
                "id": CALL_ID,
                "type": "function",
                "function": {"name": c["name"], "arguments": c["arguments"]},
            }
            for c in reply.tool_calls
        ]
    return message


def _json(response: Any) -> web.Response:
    from starlette.responses import JSONResponse

    rendered = JSONResponse(content=response.model_dump())
    return web.Response(body=rendered.body, content_type="application/json")


async def sse(request: web.Request, events: list[str]) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for data in [*events, "[DONE]"]:
        await resp.write(f"data: {data}\n\n".encode())
    await resp.write_eof()
    return resp


def _usage(prompt: list[int], ids: list[int]) -> Any:
    from vllm.entrypoints.serve.engine.protocol import UsageInfo

    total = len(prompt) + len(ids)
    return UsageInfo(prompt_tokens=len(prompt), completion_tokens=len(ids), total_tokens=total)


def _chat_logprobs(ids: list[int], positions: range, body: dict[str, Any]) -> Any:
    from vllm.entrypoints.openai.chat_completion.protocol import (
        ChatCompletionLogProb,
        ChatCompletionLogProbs,
        ChatCompletionLogProbsContent,
    )

    top = int(body.get("top_logprobs") or 0)
    content = []
    for k in positions:
        token = decode([ids[k]]) if ids[k] != IM_END else "<|im_end|>"
        entry = {"token": token, "logprob": logprob(k), "bytes": list(token.encode())}
        tops = [ChatCompletionLogProb(**entry)][:top]
        content.append(ChatCompletionLogProbsContent(**entry, top_logprobs=tops))
    return ChatCompletionLogProbs(content=content)


def _chat_whole(
    prompt: list[int], ids: list[int], message: dict[str, Any], body: dict[str, Any]
) -> Any:
    from vllm.entrypoints.generate.base.protocol import FunctionCall, ToolCall
    from vllm.entrypoints.openai.chat_completion.protocol import (
        ChatCompletionResponse,
        ChatCompletionResponseChoice,
        ChatMessage,
    )

    calls = [
        ToolCall(id=c["id"], function=FunctionCall(**c["function"]))
        for c in message.get("tool_calls") or ()
    ]
    choice = ChatCompletionResponseChoice(
        index=0,
        message=ChatMessage(
            role="assistant",
            content=message["content"],
            reasoning=message.get("reasoning"),
            tool_calls=calls,
        ),
        logprobs=_chat_logprobs(ids, range(len(ids)), body) if body.get("logprobs") else None,
        finish_reason="tool_calls" if calls else "stop",
        stop_reason=None,
        token_ids=ids if body.get("return_token_ids") else None,
    )
    return ChatCompletionResponse(
        id="chatcmpl-1",
        created=1,
        model=MODEL,
        choices=[choice],
        usage=_usage(prompt, ids),
        prompt_token_ids=prompt if body.get("return_token_ids") else None,
    )


def _chat_chunks(
    prompt: list[int], ids: list[int], message: dict[str, Any], body: dict[str, Any]
) -> list[str]:
    from vllm.entrypoints.generate.base.protocol import DeltaMessage
    from vllm.entrypoints.openai.chat_completion.protocol import (
        ChatCompletionResponseStreamChoice,
        ChatCompletionStreamResponse,
    )

    with_ids = body.get("return_token_ids") is True
    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": MODEL}
    chunks = [
        ChatCompletionStreamResponse(
            **head,
            choices=[
                ChatCompletionResponseStreamChoice(
                    index=0,
                    delta=DeltaMessage(role="assistant", content=""),
                    logprobs=None,
                    finish_reason=None,
                )
            ],
            prompt_token_ids=prompt if with_ids else None,
            prompt_text=None,
        )
    ]
    deltas = FakeVLLM._token_deltas({"ids": ids, "message": message})
    finish = "tool_calls" if message.get("tool_calls") else "stop"
    for k, (token_id, delta) in enumerate(deltas):
        last = k == len(deltas) - 1
        logprobs = _chat_logprobs(ids, range(k, k + 1), body) if body.get("logprobs") else None
        extra: dict[str, Any] = {"stop_reason": None, "weight_versions": None} if last else {}
        choice = ChatCompletionResponseStreamChoice(
            index=0,
            delta=DeltaMessage(**delta),
            logprobs=logprobs,
            finish_reason=finish if last else None,
            token_ids=[token_id] if with_ids else None,
            **extra,
        )
        chunks.append(
            ChatCompletionStreamResponse(**head, choices=[choice], kv_transfer_params=None)
        )
    if (body.get("stream_options") or {}).get("include_usage"):
        usage = _usage(prompt, ids)
        chunks.append(
            ChatCompletionStreamResponse(
                **head, choices=[], usage=usage, system_fingerprint=None, metrics=None
            )
        )
    return [c.model_dump_json(exclude_unset=True, exclude_none=not c.choices) for c in chunks]


def _completion_logprobs(ids: list[int], positions: range) -> Any:
    from vllm.entrypoints.openai.completion.protocol import CompletionLogProbs

    tokens = [decode([ids[k]]) if ids[k] != IM_END else "<|im_end|>" for k in positions]
    return CompletionLogProbs(
        text_offset=[0] * len(tokens),
        token_logprobs=[logprob(k) for k in positions],
        tokens=tokens,
        top_logprobs=[{t: logprob(k)} for t, k in zip(tokens, positions, strict=True)],
    )


def _completion_whole(prompt: list[int], ids: list[int], body: dict[str, Any]) -> Any:
    from vllm.entrypoints.openai.completion.protocol import (
        CompletionResponse,
        CompletionResponseChoice,
    )

    with_logprobs = body.get("logprobs") is not None
    choice = CompletionResponseChoice(
        index=0,
        text=decode(ids),
        logprobs=_completion_logprobs(ids, range(len(ids))) if with_logprobs else None,
        finish_reason="stop",
        stop_reason=None,
        token_ids=ids if body.get("return_token_ids") else None,
        prompt_token_ids=prompt if body.get("return_token_ids") else None,
    )
    return CompletionResponse(
        id="cmpl-1", created=1, model=MODEL, choices=[choice], usage=_usage(prompt, ids)
    )


def _completion_chunks(prompt: list[int], ids: list[int], body: dict[str, Any]) -> list[str]:
    from vllm.entrypoints.openai.completion.protocol import (
        CompletionResponseStreamChoice,
        CompletionStreamResponse,
    )

    with_ids = body.get("return_token_ids") is True
    with_logprobs = body.get("logprobs") is not None
    head = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": MODEL}
    events = []
    for k, token_id in enumerate(ids):
        last = k == len(ids) - 1
        choice = CompletionResponseStreamChoice(
            index=0,
            text=decode([token_id]),
            logprobs=_completion_logprobs(ids, range(k, k + 1)) if with_logprobs else None,
            finish_reason="stop" if last else None,
            stop_reason=None,
            prompt_token_ids=prompt if with_ids and k == 0 else None,
            token_ids=[token_id] if with_ids else None,
            weight_versions=None,
        )
        chunk = CompletionStreamResponse(**head, choices=[choice], kv_transfer_params=None)
        events.append(chunk.model_dump_json(exclude_unset=True))
    if (body.get("stream_options") or {}).get("include_usage"):
        usage = CompletionStreamResponse(
            **head, choices=[], usage=_usage(prompt, ids), system_fingerprint=None, metrics=None
        )
        events.append(usage.model_dump_json(exclude_unset=False, exclude_none=True))
    return events
