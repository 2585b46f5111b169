"""What each engine makes of a request body rolltap sent to one of its routes: the validation
error its server would answer, and every key it would drop (tests/contract/engines.py has the
rules). An empty list: the engine takes the request whole."""

from __future__ import annotations

import copy
from typing import Any

from tests.contract import engines

_BODYLESS = {"/reset_prefix_cache", "/flush_cache"}
"""Routes that read only query parameters: any key in the body is lost."""


def judge_vllm(path: str, body: Any) -> list[str]:
    from pydantic import ValidationError
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    from vllm.entrypoints.serve.tokenize.protocol import TokenizeChatRequest

    models: dict[str, Any] = {
        "/v1/chat/completions": ChatCompletionRequest,
        "/v1/completions": CompletionRequest,
        "/tokenize": TokenizeChatRequest,
    }
    if path in models:
        try:
            request, ignored = engines.vllm_validate(models[path], copy.deepcopy(body))
        except ValidationError as e:
            return [f"vllm {path}: refused: {e}"]
        # A validator drops the token prompt when the messages carry media (logged at debug).
        sent = (body.get("kv_transfer_params") or {}).get("prompt_token_ids")
        kept = (getattr(request, "kv_transfer_params", None) or {}).get("prompt_token_ids")
        if sent is not None and kept != sent:
            ignored.add("kv_transfer_params.prompt_token_ids")
        problems = [f"vllm {path}: ignores {key!r}" for key in sorted(ignored)]
        # A null a validator replaces (completions: `max_tokens` null becomes 16).
        for key, value in body.items():
            if value is None and getattr(request, key, None) is not None:
                replaced = getattr(request, key)
                problems.append(f"vllm {path}: reads {key!r}: null as {replaced!r}")
        if path == "/v1/completions" and "max_tokens" not in body:
            problems.append(f"vllm {path}: without 'max_tokens' stops at {request.max_tokens}")
        return problems
    if path == "/abort_requests":
        # vllm/entrypoints/rl/online/api_router.py reads `request_ids` from a JSON object.
        if not isinstance(body, dict):
            return [f"vllm {path}: refused: the body must be a JSON object"]
        return [f"vllm {path}: ignores {key!r}" for key in sorted(set(body) - {"request_ids"})]
    if path in _BODYLESS:
        return [f"vllm {path}: ignores {key!r}" for key in sorted(body or ())]
    return [f"vllm has no route {path}"]


def judge_sglang(sglang: engines.SGLang, path: str, body: Any) -> list[str]:
    from pydantic import ValidationError

    protocol = sglang.protocol
    if path == "/v1/chat/completions":
        try:
            request = protocol.ChatCompletionRequest.model_validate(body)
        except ValidationError as e:
            return [f"sglang {path}: refused: {e}"]
        return [
            f"sglang {path}: ignores {k!r}" for k in sorted(engines.pydantic_ignored(request, body))
        ]
    if path == "/v1/tokenize":
        try:
            tokenize = protocol.TokenizeRequest.model_validate(body)
            # Its extra keys go on to the chat request the messages are rendered as.
            chat = tokenize.to_chat_completion_request()
        except ValidationError as e:
            return [f"sglang {path}: refused: {e}"]
        extra = dict(tokenize.model_extra or {})
        lost = engines.pydantic_ignored(chat, extra)
        return [f"sglang {path}: ignores {key!r}" for key in sorted(lost)]
    if path == "/generate":
        return _generate(sglang, body)
    if path == "/update_weights_from_disk":
        fields = sglang.dataclass_fields(
            "sglang.srt.managers.io_struct", "UpdateWeightFromDiskReqInput"
        )
        return [f"sglang {path}: ignores {key!r}" for key in sorted(set(body) - fields)]
    if path in _BODYLESS:
        return [f"sglang {path}: ignores {key!r}" for key in sorted(body or ())]
    return [f"sglang has no route {path}"]


def _generate(sglang: engines.SGLang, body: dict[str, Any]) -> list[str]:
    """`/generate`: the JSON contract first (a 400 with its text), then the `GenerateReqInput`
    dataclass the body is parsed into (sglang/srt/entrypoints/http_server.py)."""
    try:
        sglang.api_types.GenerateRequest.from_json_value(body)
    except sglang.api_types.JsonContractError as e:
        return [f"sglang /generate: refused: {e}"]
    fields = sglang.dataclass_fields("sglang.srt.managers.io_struct", "GenerateReqInput")
    problems = [f"sglang /generate: ignores {key!r}" for key in sorted(set(body) - fields)]
    # Left out, max_new_tokens is SamplingParams' default (128); null is the context's room.
    sampling = body.get("sampling_params") or {}
    if "max_new_tokens" not in sampling:
        default = sglang.api_types.SamplingParams().max_new_tokens
        problems.append(f"sglang /generate: without 'max_new_tokens' stops at {default}")
    return problems
