"""An engine whose answers are built with SGLang's own response classes and serialized as its
server does (sglang/srt/entrypoints/openai/serving_chat.py, sglang/srt/utils/json_response.py,
http_server.py; 0.5.23):

* a whole chat answer: `model_dump_json(by_alias=True)`, ids per choice (`prompt_token_ids`,
  `response_token_ids`) and `meta_info` when asked, reasoning as `reasoning_content`;
* a chat stream: `model_dump_json()` per chunk, ids only in the `sglext` chunk after the
  finish_reason chunk (`input_ids`, `output_ids`), then the usage chunk;
* `/generate`: the generated API types (sglang/api/v1/api_types.py) encoded with their own
  `to_json_value`, a stream cumulative (each event holds everything so far).

Ids and the template (`/v1/tokenize`) are the fake engine's, as in vllm_answers.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from tests.contract.engines import SGLang
from tests.contract.vllm_answers import CALL_ID, Answered, logprob, sse
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


@dataclass
class SGLangAnswers:
    sglang: SGLang
    reply: Reply
    completion: Reply = field(default_factory=lambda: Reply(text="done"))
    answered: list[Answered] = field(default_factory=list)
    fake: FakeVLLM = field(default_factory=lambda: FakeVLLM(sglang=True))

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/generate", self.generate)
        app.router.add_post("/v1/tokenize", self.fake.tokenize)
        app.router.add_get("/v1/models", self.fake.models)
        app.router.add_get("/health", self.fake.health)
        return app

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        prompt = list(body.get("input_ids") or render(body["messages"], body.get("tools")))
        ids = [*encode(generated(self.reply, self.reply.text)), IM_END]
        self.answered.append(
            Answered(request.path, prompt, ids, [logprob(k) for k in range(len(ids))])
        )
        if body.get("stream"):
            return await sse(request, self._chunks(prompt, ids, body))
        raw = self._whole(prompt, ids, body).model_dump_json(by_alias=True)
        return web.Response(text=raw, content_type="application/json")

    def _parts(self) -> dict[str, Any]:
        """The parsed answer's fields, as SGLang names them."""
        calls = [
            self.sglang.protocol.ToolCall(
                id=CALL_ID,
                index=k,
                function=self.sglang.protocol.FunctionResponse(
                    name=c["name"], arguments=c["arguments"]
                ),
            )
            for k, c in enumerate(self.reply.tool_calls or ())
        ]
        return {
            "content": self.reply.text or None if calls else self.reply.text,
            "reasoning_content": self.reply.reasoning,
            "tool_calls": calls or None,
        }

    def _logprobs(self, ids: list[int], positions: range) -> Any:
        p = self.sglang.protocol
        content = []
        for k in positions:
            token = decode([ids[k]]) if ids[k] != IM_END else "<|im_end|>"
            entry = {"token": token, "bytes": list(token.encode()), "logprob": logprob(k)}
            content.append(p.ChatCompletionTokenLogprob(**entry, top_logprobs=[]))
        return p.ChoiceLogprobs(content=content)

    def _usage(self, prompt: list[int], ids: list[int]) -> Any:
        total = len(prompt) + len(ids)
        return self.sglang.protocol.UsageInfo(
            prompt_tokens=len(prompt), completion_tokens=len(ids), total_tokens=total
        )

    def _finish(self) -> str:
        return "tool_calls" if self.reply.tool_calls else "stop"

    def _whole(self, prompt: list[int], ids: list[int], body: dict[str, Any]) -> Any:
        p = self.sglang.protocol
        with_ids = body.get("return_token_ids") or body.get("return_prompt_token_ids")
        choice = p.ChatCompletionResponseChoice(
            index=0,
            message=p.ChatMessage(role="assistant", **self._parts()),
            logprobs=self._logprobs(ids, range(len(ids))) if body.get("logprobs") else None,
            finish_reason=self._finish(),
            matched_stop=IM_END,
            prompt_token_ids=prompt if with_ids else None,
            response_token_ids=ids if body.get("return_token_ids") else None,
            meta_info={"id": "gen-1", "weight_version": "default"}
            if body.get("return_meta_info")
            else None,
        )
        usage = self._usage(prompt, ids)
        return p.ChatCompletionResponse(
            id="gen-1", created=1, model=MODEL, choices=[choice], usage=usage
        )

    def _chunks(self, prompt: list[int], ids: list[int], body: dict[str, Any]) -> list[str]:
        p = self.sglang.protocol
        head = {"id": "gen-1", "created": 1, "model": MODEL}
        parts = self._parts()
        deltas = FakeVLLM._token_deltas({"ids": ids, "message": _vllm_message(parts)})
        chunks = [
            p.ChatCompletionStreamResponse(
                **head,
                choices=[
                    p.ChatCompletionResponseStreamChoice(
                        index=0, delta=p.DeltaMessage(role="assistant", content="")
                    )
                ],
            )
        ]
        for k, (_, delta) in enumerate(deltas):
            said = {
                ("reasoning_content" if key == "reasoning" else key): v for key, v in delta.items()
            }
            if "tool_calls" in said:
                said["tool_calls"] = [_tool_call(p, c) for c in said["tool_calls"]]
            logprobs = self._logprobs(ids, range(k, k + 1)) if body.get("logprobs") else None
            choice = p.ChatCompletionResponseStreamChoice(
                index=0, delta=p.DeltaMessage(**said), logprobs=logprobs
            )
            chunks.append(p.ChatCompletionStreamResponse(**head, choices=[choice]))
        finish = p.ChatCompletionResponseStreamChoice(
            index=0, delta=p.DeltaMessage(), finish_reason=self._finish(), matched_stop=IM_END
        )
        chunks.append(p.ChatCompletionStreamResponse(**head, choices=[finish]))
        if body.get("return_input_ids_in_sglext") or body.get("return_output_ids_in_sglext"):
            sglext = p.SglExt(input_ids=prompt, output_ids=[ids])
            chunks.append(p.ChatCompletionStreamResponse(**head, choices=[], sglext=sglext))
        if (body.get("stream_options") or {}).get("include_usage"):
            chunks.append(
                p.ChatCompletionStreamResponse(**head, choices=[], usage=self._usage(prompt, ids))
            )
        return [c.model_dump_json() for c in chunks]

    async def generate(self, request: web.Request) -> web.StreamResponse:
        api = self.sglang.api_types
        body = orjson.loads(await request.read())
        prompt = list(body["input_ids"])
        ids = [*encode(generated(self.completion, self.completion.text)), IM_END]
        self.answered.append(
            Answered(request.path, prompt, ids, [logprob(k) for k in range(len(ids))])
        )

        def event(n: int) -> str:
            done = n == len(ids)
            meta = api.GenerateMetaInfo(
                id="gen-2",
                prompt_tokens=len(prompt),
                completion_tokens=n,
                finish_reason=api.FinishStop(matched=IM_END) if done else None,
                output_token_logprobs=[
                    api.LogprobEntry(logprob=logprob(k), token_id=ids[k], text=None)
                    for k in range(n)
                ],
                weight_version="default",
            )
            out = api.GenerateResponse(text=decode(ids[:n]), meta_info=meta, output_ids=ids[:n])
            return orjson.dumps(out.to_json_value()).decode()

        if body.get("stream"):
            return await sse(request, [event(n) for n in range(1, len(ids) + 1)])
        return web.Response(text=event(len(ids)), content_type="application/json")


def _vllm_message(parts: dict[str, Any]) -> dict[str, Any]:
    """The message as the fake's delta splitter reads it (vLLM's names)."""
    message: dict[str, Any] = {"role": "assistant", "content": parts["content"]}
    if parts["reasoning_content"] is not None:
        message["reasoning"] = parts["reasoning_content"]
    if parts["tool_calls"]:
        message["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.function.name, "arguments": c.function.arguments},
            }
            for c in parts["tool_calls"]
        ]
    return message


def _tool_call(protocol: Any, call: dict[str, Any]) -> Any:
    function = protocol.FunctionResponse(**call.get("function", {}))
    return protocol.ToolCall(id=call.get("id"), index=call.get("index"), function=function)
