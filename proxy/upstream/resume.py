"""Continuing an answer its engine aborted for a weight update (`abort_resume`), as one answer.

When an abort_resume update begins (proxy/control/weights.py), the engines end their running
requests
with finish_reason "abort" and what they sampled so far. The call reading such an answer
(call.py) records the partial answer as a call of its own, with its version; waits at the hold
like any new call; and, once the update is committed, sends the prompt followed by the partial
ids to the same engine's /v1/completions, token-in, with the same sampling options and what is
left of the token budget. That second call is stamped with the new version and linked to the
first (`resumes`), and the trajectory holds both answers back to back (two answer turns, two
versions), never one answer silently sampled by two policies. The client sees one answer: the
continuation's completions chunks (or body) are turned into chat ones here and follow the
first part's.

Only vLLM-dialect engines (vLLM, rolltap's own) can continue token-in; answers with `n > 1` are
not resumed. Limits of continuing a chat answer token-in: tool-call and reasoning parsing happen
in the engine per request, so the continuation's text is delivered as content; a stop string
spanning the two parts is not seen; a seeded sampler starts a fresh stream. A token-in call
(proxy/tokenin/) has none of the first limit: rolltap parses its answer itself, and one parser
reads both parts as one text.
"""

from __future__ import annotations

from typing import Any

COMPLETIONS_PATH = "/v1/completions"

CARRIED_OPTIONS = (
    "model",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "include_stop_str_in_output",
    "skip_special_tokens",
    "cache_salt",
)
"""Chat request options that mean the same in a completions request (also token-in's route)."""


def continuation_request(
    chat: dict[str, Any], prompt_ids: list[int], partial_ids: list[int]
) -> dict[str, Any]:
    """The completions request continuing `chat` (the engine request that was aborted)."""
    body: dict[str, Any] = {k: chat[k] for k in CARRIED_OPTIONS if chat.get(k) is not None}
    body["prompt"] = [*prompt_ids, *partial_ids]
    # The sampled token's logprob, as the chat request asked; a token-in request's own count of
    # top logprobs (already a completions request) carries over.
    top = chat.get("logprobs")
    body["logprobs"] = top if type(top) is int else 0
    body["return_token_ids"] = True
    limit = chat.get("max_completion_tokens") or chat.get("max_tokens")
    # Left out, a completions request gets 16 tokens (vLLM's default); null is what the chat
    # request without a limit had: whatever the context leaves.
    body["max_tokens"] = max(1, limit - len(partial_ids)) if isinstance(limit, int) else None
    if chat.get("stream") is True:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


def chat_chunk(doc: dict[str, Any], head: dict[str, Any], first: tuple[int, int]) -> dict[str, Any]:
    """A completions stream chunk as a chat one of the aborted stream (its id, created and
    model); `first` is (prompt tokens, completion tokens) of the first part, for usage."""
    out: dict[str, Any] = {**head, "object": "chat.completion.chunk"}
    out["choices"] = [_chat_choice(c, stream=True) for c in doc.get("choices") or ()]
    usage = doc.get("usage")
    if isinstance(usage, dict):
        out["usage"] = client_usage(usage, first)
    elif "usage" in doc:
        out["usage"] = None
    return out


def chat_part(doc: dict[str, Any]) -> dict[str, Any]:
    """A whole completions answer as a chat answer of its own (what the second call sampled)."""
    return {"choices": [_chat_choice(c, stream=False) for c in doc.get("choices") or ()]}


def merged_answer(
    first: dict[str, Any],
    tail: dict[str, Any],
    usage: dict[str, Any] | None,
    first_usage: tuple[int, int],
) -> dict[str, Any]:
    """The aborted chat answer followed by its continuation, read as chat (`chat_part`, or a
    token-in route's answer): one chat answer. `usage`: the continuation's own."""
    (head,) = first["choices"]
    (rest,) = tail["choices"]
    choice = dict(head)
    message = dict(head.get("message") or {"role": "assistant"})
    more = rest.get("message") or {}
    for key in ("reasoning", "reasoning_content"):
        if message.get(key) or more.get(key):
            message[key] = (message.get(key) or "") + (more.get(key) or "")
    calls = [dict(c) for c in message.get("tool_calls") or ()]
    for call in more.get("tool_calls") or ():
        if "id" in call or not calls:
            calls.append(call)
            continue
        # The rest of the arguments of a call the abort cut in two (a token-in answer).
        function = dict(calls[-1].get("function") or {})
        more_arguments = str((call.get("function") or {}).get("arguments") or "")
        function["arguments"] = str(function.get("arguments") or "") + more_arguments
        calls[-1] = {**calls[-1], "function": function}
    content = (message.get("content") or "") + (more.get("content") or "")
    # With tool calls and nothing said, content is null, as the chat route answers.
    message["content"] = None if calls and not content else content
    if calls:
        message["tool_calls"] = calls
    choice["message"] = message
    choice["finish_reason"] = rest.get("finish_reason")
    choice["stop_reason"] = rest.get("stop_reason")
    logprobs, more_logprobs = head.get("logprobs"), rest.get("logprobs")
    if isinstance(logprobs, dict) and isinstance(logprobs.get("content"), list):
        extra = more_logprobs.get("content") if isinstance(more_logprobs, dict) else None
        choice["logprobs"] = {"content": logprobs["content"] + list(extra or ())}
    if isinstance(head.get("token_ids"), list):
        choice["token_ids"] = head["token_ids"] + list(rest.get("token_ids") or ())
    choice.pop("weight_versions", None)
    out = {**first, "choices": [choice]}
    if usage is not None:
        out["usage"] = client_usage(usage, first_usage)
    return out


def client_usage(usage: dict[str, Any], first: tuple[int, int]) -> dict[str, int]:
    """Usage as the client's one answer counts it: its own prompt, both parts' tokens."""
    completion = first[1] + int(usage.get("completion_tokens") or 0)
    return {
        "prompt_tokens": first[0],
        "completion_tokens": completion,
        "total_tokens": first[0] + completion,
    }


def _chat_choice(choice: dict[str, Any], *, stream: bool) -> dict[str, Any]:
    text = choice.get("text") or ""
    out: dict[str, Any] = {"index": int(choice.get("index") or 0)}
    if stream:
        out["delta"] = {"content": text} if text else {}
    else:
        out["message"] = {"role": "assistant", "content": text}
    out["logprobs"] = {"content": _chat_logprobs(choice)} if choice.get("logprobs") else None
    out["finish_reason"] = choice.get("finish_reason")
    if choice.get("finish_reason") is not None:
        out["stop_reason"] = choice.get("stop_reason")
    if isinstance(choice.get("token_ids"), list):
        out["token_ids"] = choice["token_ids"]
    return out


def _chat_logprobs(choice: dict[str, Any]) -> list[dict[str, Any]]:
    """Completions logprobs (parallel lists) as chat `logprobs.content` entries."""
    logprobs = choice.get("logprobs")
    if not isinstance(logprobs, dict):
        return []
    tokens = logprobs.get("tokens") or []
    values = logprobs.get("token_logprobs") or []
    return [
        {"token": t, "logprob": v, "bytes": list(str(t).encode()), "top_logprobs": []}
        for t, v in zip(tokens, values, strict=True)
    ]
