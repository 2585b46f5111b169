"""The generating routes, /v1/chat/completions and /v1/completions, in vLLM's dialect."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import orjson
from aiohttp import web

from ..chatformat.reasoning import ReasoningStream, prompt_opens_reasoning
from ..chatformat.tools import ToolCallStream
from .choices import ChatChoice, ChoiceOutput
from .core import Engine, GenerationFailed
from .endpoint import check_model, json_response, read_json, ready_engine, request_id
from .errors import BadRequest
from .generation import GenerationRequest, RowEvent, TokenEvent
from .protocol import ChatRequest, Generation, parse_chat, parse_completion


def _generation_request(engine: Engine, g: Generation, prompt_ids: list[int]) -> GenerationRequest:
    if g.n > engine.batcher.max_batch:
        raise BadRequest(f"`n` is {g.n}; this engine batches at most {engine.batcher.max_batch}")
    return GenerationRequest(
        prompt_ids=prompt_ids,
        max_tokens=engine.max_tokens(len(prompt_ids), g.max_tokens),
        params=g.params,
        n=g.n,
        stop=g.stop,
        stop_token_ids=g.stop_token_ids,
        ignore_eos=g.ignore_eos,
        include_stop_str_in_output=g.include_stop_str_in_output,
        skip_special_tokens=g.skip_special_tokens,
        cache_salt=g.cache_salt,
    )


def _sampled(event: RowEvent) -> list[TokenEvent]:
    """The event as a list of sampled tokens: an aborted choice's last event samples none."""
    return [event] if isinstance(event, TokenEvent) else []


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


class _Sse:
    """An event-stream response: `data: {json}` frames, then `data: [DONE]`."""

    def __init__(self, request: web.Request, headers: dict[str, str]) -> None:
        self._request = request
        self.response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", **headers}
        )

    async def open(self) -> None:
        await self.response.prepare(self._request)

    async def send(self, payload: dict[str, Any]) -> None:
        await self.response.write(b"data: " + orjson.dumps(payload) + b"\n\n")

    async def done(self) -> web.StreamResponse:
        await self.response.write(b"data: [DONE]\n\n")
        await self.response.write_eof()
        return self.response

    async def fail(self, error: GenerationFailed) -> web.StreamResponse:
        body = {"message": str(error), "type": "InternalServerError", "param": None, "code": 500}
        await self.send({"error": body})
        return await self.done()


@contextlib.asynccontextmanager
async def _events(
    engine: Engine, requests: list[GenerationRequest]
) -> AsyncIterator[AsyncGenerator[tuple[int, RowEvent], None]]:
    # aclosing: a client that disconnects closes the generator, which cancels its rows.
    async with contextlib.aclosing(engine.generate(requests)) as events:
        yield events


# -- chat ------------------------------------------------------------------------------------


async def chat_completions(request: web.Request) -> web.StreamResponse:
    engine = ready_engine(request)
    chat = parse_chat(await read_json(request))
    g = chat.generation
    check_model(engine, g.model)
    if chat.prompt_token_ids is not None:
        engine.check_ids(chat.prompt_token_ids, "kv_transfer_params")
        prompt_ids, prompt_text = chat.prompt_token_ids, engine.decode(chat.prompt_token_ids)
    else:
        rendered = engine.render(
            chat.messages,
            chat.tools,
            add_generation_prompt=chat.add_generation_prompt,
            continue_final_message=chat.continue_final_message,
            template_kwargs=chat.template_kwargs,
        )
        prompt_ids, prompt_text = rendered.token_ids, rendered.text
    generation = _generation_request(engine, g, prompt_ids)
    rid = request_id(request, g.request_id)
    choices = [_chat_choice(engine, chat, i, prompt_text) for i in range(g.n)]
    meta = {"id": f"chatcmpl-{rid}", "created": int(time.time()), "model": engine.name}
    headers = {"X-Request-Id": rid}
    if g.stream:
        return await _stream_chat(request, engine, generation, g, choices, meta, headers)
    async with _events(engine, [generation]) as events:
        async for _, event in events:
            choices[event.index].feed(event)
    body: dict[str, Any] = {
        **meta,
        "object": "chat.completion",
        "choices": [_chat_choice_body(c, g) for c in choices],
        "usage": _usage(len(prompt_ids), sum(len(c.token_ids) for c in choices)),
    }
    if g.return_token_ids:
        body["prompt_token_ids"] = prompt_ids
    return json_response(body, headers=headers)


def _chat_choice(engine: Engine, chat: ChatRequest, index: int, prompt_text: str) -> ChatChoice:
    g = chat.generation
    parse_tools = bool(chat.tools) and chat.tool_choice != "none"
    return ChatChoice(
        index,
        engine.token_text,
        logprobs=g.logprobs,
        as_ids=g.return_tokens_as_token_ids,
        reasoning=(
            ReasoningStream(prompt_opens_reasoning(prompt_text))
            if engine.reasoning_parser
            else None
        ),
        tools=ToolCallStream() if parse_tools else None,
    )


def _chat_choice_body(choice: ChatChoice, g: Generation) -> dict[str, Any]:
    body: dict[str, Any] = {
        "index": choice.index,
        "message": choice.final_message(),
        "logprobs": choice.chat_logprobs(choice.events),
        "finish_reason": choice.finish_reason,
        "stop_reason": choice.stop_reason,
    }
    if g.return_token_ids:
        body["token_ids"] = choice.token_ids
    if g.return_weight_versions:
        body["weight_versions"] = choice.weight_versions()
    if choice.tool_parse is not None:
        body["tool_parse"] = choice.tool_parse
    return body


async def _stream_chat(
    request: web.Request,
    engine: Engine,
    generation: GenerationRequest,
    g: Generation,
    choices: list[ChatChoice],
    meta: dict[str, Any],
    headers: dict[str, str],
) -> web.StreamResponse:
    sse = _Sse(request, headers)
    await sse.open()
    frame = {**meta, "object": "chat.completion.chunk"}
    usage: dict[str, Any] = {"usage": None} if g.include_usage else {}
    for choice in choices:
        first: dict[str, Any] = {
            "index": choice.index,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
        chunk = {**frame, "choices": [first], **usage}
        if g.return_token_ids:
            chunk["prompt_token_ids"] = generation.prompt_ids
        await sse.send(chunk)
    calls_sent = [0] * len(choices)
    try:
        async with _events(engine, [generation]) as events:
            async for _, event in events:
                choice = choices[event.index]
                delta = choice.feed(event)
                body: dict[str, Any] = {}
                if delta.reasoning:
                    body["reasoning"] = delta.reasoning
                if delta.content:
                    body["content"] = delta.content
                if delta.tool_calls:
                    body["tool_calls"] = [
                        {"index": calls_sent[choice.index] + k, **call.to_openai()}
                        for k, call in enumerate(delta.tool_calls)
                    ]
                    calls_sent[choice.index] += len(delta.tool_calls)
                finished = choice.finish_reason is not None
                # A chunk per sampled token when ids or logprobs are on, so none goes missing.
                if not (body or finished or g.return_token_ids or g.logprobs):
                    continue
                part: dict[str, Any] = {
                    "index": choice.index,
                    "delta": body,
                    "logprobs": choice.chat_logprobs(_sampled(event)),
                    "finish_reason": choice.finish_reason if finished else None,
                }
                if finished:
                    part["stop_reason"] = choice.stop_reason
                    if choice.tool_parse is not None:
                        part["tool_parse"] = choice.tool_parse
                    if g.return_weight_versions:
                        part["weight_versions"] = choice.weight_versions()
                if g.return_token_ids:
                    part["token_ids"] = [e.token_id for e in _sampled(event)]
                await sse.send({**frame, "choices": [part], **usage})
    except GenerationFailed as e:
        return await sse.fail(e)
    if g.include_usage:
        total = sum(len(c.token_ids) for c in choices)
        usage_body = _usage(len(generation.prompt_ids), total)
        await sse.send({**frame, "choices": [], "usage": usage_body})
    return await sse.done()


# -- completions -----------------------------------------------------------------------------


async def completions(request: web.Request) -> web.StreamResponse:
    engine = ready_engine(request)
    req = parse_completion(await read_json(request))
    g = req.generation
    check_model(engine, g.model)
    prompt_ids: list[list[int]] = []
    for prompt in req.prompts:
        if isinstance(prompt, str):
            prompt_ids.append(engine.encode(prompt, req.add_special_tokens))
        else:
            engine.check_ids(prompt, "prompt")
            prompt_ids.append(prompt)
    generations = [_generation_request(engine, g, ids) for ids in prompt_ids]
    rid = request_id(request, g.request_id)
    choices = [
        ChoiceOutput(p * g.n + i, engine.token_text, g.logprobs, g.return_tokens_as_token_ids)
        for p in range(len(prompt_ids))
        for i in range(g.n)
    ]
    meta = {"id": f"cmpl-{rid}", "created": int(time.time()), "model": engine.name}
    headers = {"X-Request-Id": rid}
    prompt_total = sum(len(ids) for ids in prompt_ids)
    if g.stream:
        return await _stream_completion(
            request, engine, generations, g, choices, meta, headers, prompt_total
        )
    async with _events(engine, generations) as events:
        async for position, event in events:
            choices[position * g.n + event.index].record(event)
    body = {
        **meta,
        "object": "text_completion",
        "choices": [_completion_choice_body(c, g, prompt_ids[c.index // g.n]) for c in choices],
        "usage": _usage(prompt_total, sum(len(c.token_ids) for c in choices)),
    }
    return json_response(body, headers=headers)


def _completion_choice_body(
    choice: ChoiceOutput, g: Generation, prompt_ids: list[int]
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "index": choice.index,
        "text": choice.text,
        "logprobs": choice.completion_logprobs(choice.events, 0),
        "finish_reason": choice.finish_reason,
        "stop_reason": choice.stop_reason,
        "prompt_logprobs": None,
    }
    if g.return_token_ids:
        body["prompt_token_ids"] = prompt_ids
        body["token_ids"] = choice.token_ids
    if g.return_weight_versions:
        body["weight_versions"] = choice.weight_versions()
    return body


async def _stream_completion(
    request: web.Request,
    engine: Engine,
    generations: list[GenerationRequest],
    g: Generation,
    choices: list[ChoiceOutput],
    meta: dict[str, Any],
    headers: dict[str, str],
    prompt_total: int,
) -> web.StreamResponse:
    sse = _Sse(request, headers)
    await sse.open()
    frame = {**meta, "object": "text_completion"}
    usage: dict[str, Any] = {"usage": None} if g.include_usage else {}
    try:
        async with _events(engine, generations) as events:
            async for position, event in events:
                choice = choices[position * g.n + event.index]
                offset = len(choice.text)
                choice.record(event)
                finished = choice.finish_reason is not None
                part: dict[str, Any] = {
                    "index": choice.index,
                    "text": event.text,
                    "logprobs": choice.completion_logprobs(_sampled(event), offset),
                    "finish_reason": choice.finish_reason,
                    "stop_reason": choice.stop_reason if finished else None,
                }
                if finished and g.return_weight_versions:
                    part["weight_versions"] = choice.weight_versions()
                if g.return_token_ids:
                    sampled = _sampled(event)
                    part["token_ids"] = [e.token_id for e in sampled]
                    if sampled and len(choice.token_ids) == 1:
                        part["prompt_token_ids"] = generations[position].prompt_ids
                await sse.send({**frame, "choices": [part], **usage})
    except GenerationFailed as e:
        return await sse.fail(e)
    if g.include_usage:
        total = sum(len(c.token_ids) for c in choices)
        await sse.send({**frame, "choices": [], "usage": _usage(prompt_total, total)})
    return await sse.done()
