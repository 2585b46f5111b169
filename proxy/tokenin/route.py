"""The engine's token-in route: a prompt of ids out, the answer back as a chat completion.

vLLM and rolltap's engine take `/v1/completions` with a list-of-ids `prompt` and
`return_token_ids`; SGLang takes `/generate` with `input_ids`. Neither parses the text, so the
answer is split here (parse.py) and reshaped as the chat completion (or chunks) the engine's
chat route would have sent, ids and logprobs where vLLM's chat route puts them: everything
after this (capture, stripping, every dialect's rendering) reads it like any chat answer;
routed experts (proxy/upstream/routed.py) too: SGLang's `meta_info.routed_experts` as the chat
route's
`sglext`, vLLM's per-choice field as the chat choice's.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ...chatformat.parse import AnswerParser, CallDelta, Delta, thinking_of
from ..upstream.engines import EngineKind, Extras, Prepared
from ..upstream.resume import CARRIED_OPTIONS, COMPLETIONS_PATH

SGLANG_PATH = "/generate"

# The same options as a resumed continuation carries, and the client's choice to stream.
_CARRIED = (*CARRIED_OPTIONS, "stream")

_SGLANG_SAMPLING = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "repetition_penalty": "repetition_penalty",
    "stop": "stop",
    "stop_token_ids": "stop_token_ids",
    "ignore_eos": "ignore_eos",
    "skip_special_tokens": "skip_special_tokens",
    "seed": "sampling_seed",
}


class TokenInRoute:
    """One call's token-in request and its answer turned into chat (an `EngineCall` route)."""

    reads_text = True

    def __init__(
        self,
        prompt_ids: list[int],
        reasoning: str | None,
        tool_parser: str | None,
        tools: list[dict[str, Any]] | None,
    ) -> None:
        self.prompt_ids = prompt_ids
        self._parsing = (reasoning, tool_parser, tools)
        self._parser = AnswerParser(reasoning, tool_parser, tools, stream=False)
        """Replaced by `prepare` once it is known whether the answer streams."""
        self._kind = EngineKind.VLLM
        self._head: dict[str, Any] | None = None
        self._seen_ids = 0
        self._seen_text = 0
        self._top = 0
        self._asked_logprobs = False
        self._opened = False
        """The first chunk with a choice went out (it carries the role and the prompt ids)."""

    def prepare(self, chat: dict[str, Any], kind: EngineKind) -> Prepared:
        self._kind = kind
        asked_logprobs = self._asked_logprobs = chat.get("logprobs") is True
        self._top = int(chat.get("top_logprobs") or 0) if asked_logprobs else 0
        stream = chat.get("stream") is True
        thinking = thinking_of(chat.get("chat_template_kwargs"))
        self._parser = AnswerParser(*self._parsing, stream=stream, thinking=thinking)
        options = chat.get("stream_options") if isinstance(chat.get("stream_options"), dict) else {}
        asked_usage = bool(options.get("include_usage")) if options else False
        extras = Extras(
            token_ids=chat.get("return_token_ids") is not True, logprobs=not asked_logprobs
        )
        limit = chat.get("max_completion_tokens") or chat.get("max_tokens")
        if kind is EngineKind.SGLANG:
            return Prepared(self._sglang(chat, limit, stream), extras, asked_usage, SGLANG_PATH)
        body: dict[str, Any] = {k: chat[k] for k in _CARRIED if chat.get(k) is not None}
        body["prompt"] = self.prompt_ids
        body["logprobs"] = self._top
        body["return_token_ids"] = True
        body["return_weight_versions"] = True  # an in_place update's spans (upstream/engines.py)
        extras = dataclasses.replace(extras, weight_versions=True)
        # Completions default to 16 tokens; null is the chat route's default (what is left).
        body["max_tokens"] = limit if isinstance(limit, int) else None
        if stream:
            body["stream_options"] = {"include_usage": True}
        return Prepared(body, extras, asked_usage, COMPLETIONS_PATH)

    def _sglang(self, chat: dict[str, Any], limit: Any, stream: bool) -> dict[str, Any]:
        sampling = {v: chat[k] for k, v in _SGLANG_SAMPLING.items() if chat.get(k) is not None}
        # Null, as the chat route has it without a limit: all the context leaves. Left out,
        # /generate stops at SGLang's default of 128 tokens (SamplingParams.max_new_tokens).
        sampling["max_new_tokens"] = limit if isinstance(limit, int) else None
        body: dict[str, Any] = {
            "input_ids": self.prompt_ids,
            "sampling_params": sampling,
            "return_logprob": True,
            "logprob_start_len": -1,
            "top_logprobs_num": self._top,
            "stream": stream,
        }
        # No `model`: /generate serves the one model loaded, and neither its JSON contract
        # (sglang/api/v1) nor GenerateReqInput has the field, so SGLang would drop it.
        return body

    # -- answers -----------------------------------------------------------------------------

    def whole(self, doc: dict[str, Any], *, resumes: bool = False) -> dict[str, Any]:
        """A whole token-in answer as a chat completion. `resumes`: an abort will be continued
        (its continuation read here too), so the parser keeps what it holds: a tool call the
        abort cut in two is read whole from both parts."""
        text, ids, logprobs, finish, stop, usage = self._read(doc)
        delta = self._parser.push(text, ids)
        if not (resumes and finish == "abort"):
            delta.add(self._parser.finish())
            delta = self._parser.settle(delta)
        message: dict[str, Any] = {"role": "assistant", "content": delta.content or None}
        if delta.reasoning:
            message["reasoning"] = delta.reasoning
        if delta.tool_calls:
            # A call begun before an abort this answer continues has no id here: its
            # arguments are appended to the first part's call (resume.merged_answer).
            message["tool_calls"] = [_call(c) for c in delta.calls()]
        elif message["content"] is None:
            message["content"] = ""
        choice = {
            "index": 0,
            "message": message,
            "logprobs": {"content": logprobs} if logprobs is not None else None,
            "finish_reason": self._finish(finish),
            "stop_reason": stop,
            "token_ids": ids,
        }
        self._tool_parse(choice, finish, resumes)
        out = {**self._meta(doc), "object": "chat.completion", "choices": [choice]}
        if usage is not None:
            out["usage"] = usage
        out["prompt_token_ids"] = self._engine_prompt(doc)
        self._routed_experts(doc, out)
        return out

    def chunk(self, doc: dict[str, Any], *, resumes: bool = False) -> dict[str, Any]:
        """One token-in stream chunk as a chat completion chunk (`resumes`: as for `whole`)."""
        meta = self._meta(doc)
        out: dict[str, Any] = {**meta, "object": "chat.completion.chunk"}
        if self._kind is not EngineKind.SGLANG and not doc.get("choices"):
            out["choices"] = []
            if "usage" in doc:
                out["usage"] = doc["usage"]
            return out
        text, ids, logprobs, finish, stop, usage = self._read(doc)
        delta = self._parser.push(text, ids)
        if finish is not None and not (resumes and finish == "abort"):
            delta.add(self._parser.finish())
        body = self._delta(delta)
        first, self._opened = not self._opened, True
        if first:
            body = {"role": "assistant", **({"content": ""} if not body else {}), **body}
        choice: dict[str, Any] = {
            "index": 0,
            "delta": body,
            "logprobs": {"content": logprobs} if logprobs is not None else None,
            "finish_reason": self._finish(finish) if finish is not None else None,
            "token_ids": ids,
        }
        if finish is not None:
            choice["stop_reason"] = stop
            self._tool_parse(choice, finish, resumes)
        out["choices"] = [choice]
        if first:
            out["prompt_token_ids"] = self._engine_prompt(doc)
        if usage is not None:
            out["usage"] = usage
        self._routed_experts(doc, out)
        return out

    def _tool_parse(self, choice: dict[str, Any], finish: str | None, resumes: bool) -> None:
        """The parse outcome where capture reads it (engines.capture_response), once the answer
        is read to its end (an abort that will be continued is not its end)."""
        outcome = self._parser.tool_parse
        if outcome is not None and not (resumes and finish == "abort"):
            choice["tool_parse"] = outcome

    def _routed_experts(self, doc: dict[str, Any], out: dict[str, Any]) -> None:
        """Routed experts (proxy/upstream/routed.py) where the chat route puts them: SGLang's
        `meta_info` as the chat's `sglext`, vLLM's completions choice as the chat choice."""
        if self._kind is EngineKind.SGLANG:
            found = (doc.get("meta_info") or {}).get("routed_experts")
            if found is not None:
                out["sglext"] = {"routed_experts": found}
            return
        for choice in doc.get("choices") or ():
            if isinstance(choice, dict) and choice.get("routed_experts") is not None:
                out["choices"][0]["routed_experts"] = choice["routed_experts"]

    def _engine_prompt(self, doc: dict[str, Any]) -> list[int]:
        """The prompt ids as the engine echoes them (vLLM: per choice), else as sent."""
        for choice in doc.get("choices") or ():
            if isinstance(choice, dict) and isinstance(choice.get("prompt_token_ids"), list):
                return list(choice["prompt_token_ids"])
        return self.prompt_ids

    def _delta(self, delta: Delta) -> dict[str, Any]:
        body: dict[str, Any] = {}
        if delta.reasoning:
            body["reasoning"] = delta.reasoning
        if delta.content:
            body["content"] = delta.content
        if delta.tool_calls:
            body["tool_calls"] = [{"index": c.index, **_call(c)} for c in delta.calls()]
        return body

    def _finish(self, finish: str | None) -> str | None:
        if finish == "stop" and self._parser.calls:
            return "tool_calls"
        return finish

    def _meta(self, doc: dict[str, Any]) -> dict[str, Any]:
        if self._head is None:
            rid = str(doc.get("id") or doc.get("meta_info", {}).get("id") or "")
            self._head = {
                "id": "chatcmpl-" + rid.removeprefix("cmpl-"),
                "created": doc.get("created", 0),
                "model": doc.get("model", ""),
            }
        return dict(self._head)

    def _read(
        self, doc: dict[str, Any]
    ) -> tuple[str, list[int], list[dict[str, Any]] | None, str | None, Any, dict[str, Any] | None]:
        """(new text, new ids, new chat logprob entries, finish, stop reason, usage)."""
        if self._kind is EngineKind.SGLANG:
            return self._read_sglang(doc)
        (choice,) = doc["choices"]
        ids = list(choice.get("token_ids") or ())
        self._seen_ids += len(ids)
        usage = doc.get("usage") if isinstance(doc.get("usage"), dict) else None
        return (
            choice.get("text") or "",
            ids,
            _chat_logprobs(choice.get("logprobs"), full=self._asked_logprobs),
            choice.get("finish_reason"),
            choice.get("stop_reason"),
            usage,
        )

    def _read_sglang(
        self, doc: dict[str, Any]
    ) -> tuple[str, list[int], list[dict[str, Any]] | None, str | None, Any, dict[str, Any] | None]:
        # /generate streams cumulatively: each chunk holds everything so far.
        meta = doc.get("meta_info") or {}
        all_ids = list(doc.get("output_ids") or ())
        ids = all_ids[self._seen_ids :]
        entries = meta.get("output_token_logprobs") or []
        logprobs = [
            {"token": f"token_id:{e[1]}", "logprob": e[0], "bytes": None, "top_logprobs": []}
            for e in entries[self._seen_ids :]
        ]
        self._seen_ids = len(all_ids)
        text = str(doc.get("text") or "")
        new_text, self._seen_text = text[self._seen_text :], len(text)
        reason = meta.get("finish_reason")
        finish = reason.get("type") if isinstance(reason, dict) else None
        stop = reason.get("matched") if isinstance(reason, dict) else None
        usage = None
        if finish is not None:
            prompt = int(meta.get("prompt_tokens") or len(self.prompt_ids))
            completion = int(meta.get("completion_tokens") or len(all_ids))
            usage = {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            }
        return new_text, ids, logprobs, finish, stop, usage


def _call(call: CallDelta) -> dict[str, Any]:
    """A call's piece as chat's `tool_calls` entry: its opening carries id, type and name, as
    OpenAI's and vLLM's first delta of a call do; the rest only arguments."""
    if call.id is None:
        return {"function": {"arguments": call.arguments}}
    function = {"name": call.name, "arguments": call.arguments}
    return {"id": call.id, "type": "function", "function": function}


def _chat_logprobs(logprobs: Any, full: bool) -> list[dict[str, Any]] | None:
    """Completions logprobs (parallel lists) as chat `logprobs.content` entries; only the
    logprob each when the client did not ask (capture reads no more, and they are stripped)."""
    if not isinstance(logprobs, dict):
        return None
    tokens = logprobs.get("tokens") or []
    values = logprobs.get("token_logprobs") or []
    if not full:
        return [{"token": t, "logprob": v} for t, v in zip(tokens, values, strict=True)]
    tops = logprobs.get("top_logprobs") or [None] * len(tokens)
    return [
        {
            "token": t,
            "logprob": v,
            "bytes": list(str(t).encode()),
            "top_logprobs": [
                {"token": k, "logprob": p, "bytes": list(str(k).encode())}
                for k, p in (top or {}).items()
            ],
        }
        for t, v, top in zip(tokens, values, tops, strict=True)
    ]
