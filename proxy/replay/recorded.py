"""A recorded call, read back as the chat answer an engine gave, and served as one.

The record keeps what the client was answered (for a stream, the whole answer assembled: chat
completion, Responses or Messages object) and the engine's token ids and logprobs, not the raw
engine events. `recorded_answer` rebuilds the engine's chat completion from them: chat answers
directly, Responses and Messages answers through the same readers that restore a harness's
history (recall.py), with the token ids and logprobs put back where vLLM puts them.
`RecordedAnswer` then plays that completion through the relay as a `EngineAnswer`, whole or as
chat chunks, so each dialect's own rendering turns it into what the client sees: one
implementation of every dialect's bytes, and the handles and ids in the answer belong to the
replay's rollout, as they would in a live call.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from ...store import CallDialect, CallStatus, CallTokens, CallView
from ..recall import RecordedTurn
from ..upstream.call import Chunk, EngineError, error_message
from ..upstream.engines import EngineKind, Prepared, capture_response, prepare_chat
from ..upstream.exchange import Exchange, now

_CAPPED = "by the proxy's max_tokens_cap"
"""The note a call capped by the proxy carries (call.py): its client saw a normal ending."""


@dataclass(frozen=True)
class RecordedCall:
    """One call of the original rollout, as the cassette serves and compares it."""

    call: CallView
    request: Any
    """The client's request body, parsed (None when it was not JSON)."""
    answer: dict[str, Any] | None
    """The engine's chat completion rebuilt, without token data; None for a failed call."""
    tokens: CallTokens | None
    failure: EngineError | None
    """A failed call: served as the engine refusing with the recorded status and message."""

    @property
    def capped(self) -> bool:
        return _CAPPED in (self.call.error or "")


def recorded_call(
    call: CallView,
    request: bytes | None,
    response: bytes | None,
    tokens: CallTokens | None,
    turns: Mapping[CallDialect, RecordedTurn],
) -> RecordedCall:
    parsed = _json(request)
    if call.status is not CallStatus.OK:
        status = call.http_status or 502
        message = error_message(response) if response else (call.error or "failed")
        body = orjson.dumps({"error": {"message": message, "type": "replayed", "code": status}})
        return RecordedCall(call, parsed, None, tokens, EngineError(status, body))
    return RecordedCall(call, parsed, _answer(call, response, tokens, turns), tokens, None)


def _answer(
    call: CallView,
    response: bytes | None,
    tokens: CallTokens | None,
    turns: Mapping[CallDialect, RecordedTurn],
) -> dict[str, Any]:
    doc = _json(response)
    head = {
        "id": f"chatcmpl-{call.id}",
        "object": "chat.completion",
        "created": int(call.received_at.timestamp()),
        "model": call.model,
    }
    choices: list[dict[str, Any]] = []
    if call.dialect is CallDialect.CHAT and isinstance(doc, dict):
        head |= {k: doc[k] for k in ("id", "created", "model", "system_fingerprint") if k in doc}
        for choice in doc.get("choices") or ():
            if isinstance(choice, dict):
                keep = ("index", "message", "finish_reason", "logprobs", "stop_reason")
                choices.append({k: choice[k] for k in keep if k in choice})
    else:
        turn = turns[call.dialect](response, 0) if response and call.dialect in turns else None
        if turn is not None:
            choices.append({"index": 0, "message": turn.message, "finish_reason": None})
    by_index = {c.index: c for c in tokens.choices} if tokens is not None else {}
    for choice in choices:
        recorded = by_index.get(int(choice.get("index") or 0))
        if choice.get("finish_reason") is None:
            choice["finish_reason"] = (
                recorded.finish_reason if recorded is not None else call.finish_reason
            ) or "stop"
    usage = call.usage if isinstance(call.usage, dict) else None
    if tokens is not None:
        completion = sum(len(c.token_ids) for c in tokens.choices)
        usage = {
            "prompt_tokens": len(tokens.prompt_ids),
            "completion_tokens": completion,
            "total_tokens": len(tokens.prompt_ids) + completion,
        }
    return {**head, "choices": choices, **({"usage": usage} if usage else {})}


class RecordedAnswer:
    """relay.EngineAnswer from a recorded call. `with_tokens=False` serves the answer without
    token data (its request diverged: the recorded prompt ids are not this request's)."""

    def __init__(
        self,
        exchange: Exchange,
        body: dict[str, Any],
        recorded: RecordedCall,
        source: str,
        *,
        with_tokens: bool = True,
    ) -> None:
        self._exchange = exchange
        self._prepared = prepare_chat(body, EngineKind.VLLM)
        self._recorded = recorded
        self._source = source
        self._with_tokens = with_tokens
        self.capped = recorded.capped
        self.error: EngineError | None = None

    @property
    def prepared(self) -> Prepared:
        return self._prepared

    async def open(self) -> None:
        exchange = self._exchange
        exchange.sent(now(), self._source, orjson.dumps(self._prepared.body))
        exchange.notes.append(f"replayed from call {self._recorded.call.id}")
        if not self._with_tokens:
            exchange.notes.append("its request diverged: served without token ids")
        self.error = self._recorded.failure

    async def read_body(self) -> tuple[bytes, dict[str, Any]]:
        doc = self._whole()
        self._captured(doc)
        return orjson.dumps(doc), doc

    async def chunks(self) -> AsyncIterator[list[Chunk]]:
        docs = self._chunks()
        for doc in docs:
            self._captured(doc)
        yield [Chunk(orjson.dumps(doc), doc) for doc in docs]

    def close(self) -> None:
        """Nothing is open: the answer is in memory."""

    def _captured(self, doc: dict[str, Any]) -> None:
        answer = self._exchange.answer
        capture_response(doc, answer.captured)
        if isinstance(doc.get("usage"), dict):
            answer.usage = doc["usage"]
        answer.first_token_at = answer.first_token_at or now()
        answer.upstream_done = time.perf_counter()

    def _whole(self) -> dict[str, Any]:
        answer = self._answer()
        choices = []
        for choice in answer["choices"]:
            c = {**choice, **self._choice_tokens(choice)}
            choices.append(c)
        return {**answer, "choices": choices, **self._prompt_tokens()}

    def _chunks(self) -> list[dict[str, Any]]:
        answer = self._answer()
        head: dict[str, Any] = {k: answer[k] for k in ("id", "created", "model") if k in answer}
        head["object"] = "chat.completion.chunk"

        def chunk(index: int, delta: dict[str, Any], **extra: Any) -> dict[str, Any]:
            choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}
            return {**head, "choices": [{**choice, **extra}]}

        docs: list[dict[str, Any]] = []
        for choice in answer["choices"]:
            index = int(choice.get("index") or 0)
            message = choice.get("message") or {}
            docs.append(chunk(index, {"role": "assistant", "content": ""}))
            for key in ("reasoning", "reasoning_content"):
                if message.get(key):
                    docs.append(chunk(index, {key: message[key]}))
            if message.get("content"):
                docs.append(chunk(index, {"content": message["content"]}))
            for k, call in enumerate(message.get("tool_calls") or ()):
                docs.append(chunk(index, {"tool_calls": [{"index": k, **call}]}))
            finish = {"finish_reason": choice.get("finish_reason")}
            docs.append(chunk(index, {}, **finish, **self._choice_tokens(choice)))
        if docs:
            docs[0] |= self._prompt_tokens()
        if "usage" in answer:
            docs.append({**head, "choices": [], "usage": answer["usage"]})
        return docs

    def _answer(self) -> dict[str, Any]:
        assert self._recorded.answer is not None, "a failed call is served as its error"
        return self._recorded.answer

    def _prompt_tokens(self) -> dict[str, Any]:
        tokens = self._recorded.tokens
        if tokens is None or not self._with_tokens:
            return {}
        return {"prompt_token_ids": tokens.prompt_ids.tolist()}

    def _choice_tokens(self, choice: dict[str, Any]) -> dict[str, Any]:
        """vLLM's per-choice `token_ids` and `logprobs.content` for this recorded choice."""
        tokens = self._recorded.tokens
        index = int(choice.get("index") or 0)
        found = next((c for c in tokens.choices if c.index == index), None) if tokens else None
        if found is None or not self._with_tokens:
            return {}
        out: dict[str, Any] = {"token_ids": found.token_ids.tolist()}
        shown = choice.get("logprobs")
        entries = shown.get("content") if isinstance(shown, dict) else None
        if isinstance(entries, list) and len(entries) == len(found.token_ids):
            out["logprobs"] = shown  # what the client asked for and saw, tokens and all
        elif found.logprobs is not None:
            out["logprobs"] = {"content": [_entry(float(lp)) for lp in found.logprobs]}
        return out


def _entry(logprob: float) -> dict[str, Any]:
    return {"token": "", "logprob": logprob, "bytes": None, "top_logprobs": []}


def _json(raw: bytes | None) -> Any:
    if not raw:
        return None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
