"""Request bodies of the OpenAI/vLLM routes, checked field by field into typed requests."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .errors import BadRequest
from .params import SamplingParams

MAX_LOGPROBS = 20
"""vLLM's default --max-logprobs."""

_MISSING = object()


class Fields:
    """Typed reads of a JSON object; a wrong type or value is a 400 naming the field."""

    def __init__(self, data: object) -> None:
        if not isinstance(data, dict):
            raise BadRequest("the request body must be a JSON object")
        self.data: dict[str, Any] = data

    def _get(self, key: str) -> Any:
        value = self.data.get(key, _MISSING)
        return _MISSING if value is None else value

    def string(self, key: str) -> str | None:
        value = self._get(key)
        if value is _MISSING:
            return None
        if not isinstance(value, str):
            raise BadRequest(f"`{key}` must be a string", param=key)
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self._get(key)
        if value is _MISSING:
            return default
        if not isinstance(value, bool):
            raise BadRequest(f"`{key}` must be a boolean", param=key)
        return value

    def integer(
        self, key: str, default: int | None, low: int | None = None, high: int | None = None
    ) -> int | None:
        value = self._get(key)
        if value is _MISSING:
            return default
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool):
            raise BadRequest(f"`{key}` must be an integer", param=key)
        _check_range(key, value, low, high)
        return value

    def number(
        self, key: str, default: float, low: float | None = None, high: float | None = None
    ) -> float:
        value = self._get(key)
        if value is _MISSING:
            return default
        if (
            not isinstance(value, int | float)
            or isinstance(value, bool)
            or not math.isfinite(value)
        ):
            raise BadRequest(f"`{key}` must be a number", param=key)
        _check_range(key, value, low, high)
        return float(value)

    def strings(self, key: str) -> tuple[str, ...]:
        """A string or a list of strings (OpenAI's `stop`)."""
        value = self._get(key)
        if value is _MISSING:
            return ()
        if isinstance(value, str):
            return (value,)
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return tuple(value)
        raise BadRequest(f"`{key}` must be a string or a list of strings", param=key)

    def token_ids(self, key: str) -> list[int] | None:
        value = self._get(key)
        if value is _MISSING:
            return None
        if not is_id_list(value):
            raise BadRequest(f"`{key}` must be a list of token ids", param=key)
        return list(value)

    def mapping(self, key: str) -> dict[str, Any] | None:
        value = self._get(key)
        if value is _MISSING:
            return None
        if not isinstance(value, dict):
            raise BadRequest(f"`{key}` must be an object", param=key)
        return value

    def array(self, key: str) -> list[Any] | None:
        value = self._get(key)
        if value is _MISSING:
            return None
        if not isinstance(value, list):
            raise BadRequest(f"`{key}` must be an array", param=key)
        return value


def is_id_list(value: object) -> bool:
    return isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value
    )


def _check_range(key: str, value: float, low: float | None, high: float | None) -> None:
    if low is not None and value < low:
        raise BadRequest(f"`{key}` must be at least {low}, got {value}", param=key)
    if high is not None and value > high:
        raise BadRequest(f"`{key}` must be at most {high}, got {value}", param=key)


@dataclass(frozen=True)
class Generation:
    """What both generation routes share: sampling, stopping and output options."""

    model: str | None
    params: SamplingParams
    max_tokens: int | None
    n: int
    stop: tuple[str, ...]
    stop_token_ids: frozenset[int]
    ignore_eos: bool
    include_stop_str_in_output: bool
    skip_special_tokens: bool
    stream: bool
    include_usage: bool
    logprobs: bool
    return_token_ids: bool
    return_tokens_as_token_ids: bool
    return_weight_versions: bool
    """vLLM's opt-in `weight_versions`: per choice, {version, start, end} spans of its output."""
    request_id: str | None
    cache_salt: str | None
    """vLLM's prefix-cache salt: only requests with the same salt share cached prefixes."""


@dataclass(frozen=True)
class ChatRequest:
    generation: Generation
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    tool_choice: str | dict[str, Any]
    add_generation_prompt: bool
    continue_final_message: bool
    template_kwargs: dict[str, Any]
    prompt_token_ids: list[int] | None
    """vLLM's hidden token-in: `kv_transfer_params.prompt_token_ids` skips templating."""


@dataclass(frozen=True)
class CompletionRequest:
    generation: Generation
    prompts: list[str | list[int]]
    add_special_tokens: bool


def parse_generation(f: Fields, *, chat: bool) -> Generation:
    if chat:
        logprobs = f.boolean("logprobs", False)
        top = f.integer("top_logprobs", 0, 0, MAX_LOGPROBS) or 0
        if top and not logprobs:
            raise BadRequest("when using `top_logprobs`, `logprobs` must be true", "top_logprobs")
        max_tokens = f.integer("max_completion_tokens", None, 1)
        if max_tokens is None:
            max_tokens = f.integer("max_tokens", None, 1)
    else:
        count = f.integer("logprobs", None, 0, MAX_LOGPROBS)
        logprobs, top = count is not None, count or 0
        # vLLM: 16 when left out, but an explicit null means whatever the context leaves
        # (token-in callers send null to get the chat route's default).
        explicit_null = "max_tokens" in f.data and f.data["max_tokens"] is None
        max_tokens = None if explicit_null else f.integer("max_tokens", 16, 1)
    if f.integer("prompt_logprobs", None):
        raise BadRequest("`prompt_logprobs` is not supported by this engine", "prompt_logprobs")
    if f.integer("best_of", None, 1) not in (None, 1):
        raise BadRequest("`best_of` is not supported by this engine", "best_of")
    response_format = f.mapping("response_format")
    if response_format and response_format.get("type", "text") != "text":
        raise BadRequest("structured `response_format` is not supported", "response_format")
    stream_options = f.mapping("stream_options") or {}
    stream = f.boolean("stream", False)
    if stream_options and not stream:
        raise BadRequest("`stream_options` needs `stream: true`", "stream_options")
    include_usage = Fields(stream_options).boolean("include_usage", False)
    cache_salt = f.string("cache_salt")
    if cache_salt == "":
        raise BadRequest("`cache_salt` must be a non-empty string", "cache_salt")
    top_k = f.integer("top_k", 0, -1) or 0
    params = SamplingParams(
        temperature=f.number("temperature", 1.0, 0.0),
        top_p=f.number("top_p", 1.0, 1e-9, 1.0),
        top_k=max(top_k, 0),
        min_p=f.number("min_p", 0.0, 0.0, 1.0),
        seed=f.integer("seed", None),
        presence_penalty=f.number("presence_penalty", 0.0, -2.0, 2.0),
        frequency_penalty=f.number("frequency_penalty", 0.0, -2.0, 2.0),
        repetition_penalty=f.number("repetition_penalty", 1.0, 1e-9),
        logit_bias=_logit_bias(f),
        top_logprobs=top,
    )
    return Generation(
        model=f.string("model"),
        params=params,
        max_tokens=max_tokens,
        n=f.integer("n", 1, 1, 128) or 1,
        stop=f.strings("stop"),
        stop_token_ids=frozenset(f.token_ids("stop_token_ids") or ()),
        ignore_eos=f.boolean("ignore_eos", False),
        include_stop_str_in_output=f.boolean("include_stop_str_in_output", False),
        skip_special_tokens=f.boolean("skip_special_tokens", True),
        stream=stream,
        include_usage=include_usage,
        logprobs=logprobs,
        return_token_ids=f.boolean("return_token_ids", False),
        return_tokens_as_token_ids=f.boolean("return_tokens_as_token_ids", False),
        return_weight_versions=f.boolean("return_weight_versions", False),
        request_id=f.string("request_id"),
        cache_salt=cache_salt,
    )


def _logit_bias(f: Fields) -> tuple[tuple[int, float], ...]:
    raw = f.mapping("logit_bias") or {}
    bias: list[tuple[int, float]] = []
    for key, value in raw.items():
        if not str(key).isdigit() or not isinstance(value, int | float) or isinstance(value, bool):
            raise BadRequest("`logit_bias` maps token ids to numbers", "logit_bias")
        bias.append((int(key), max(-100.0, min(100.0, float(value)))))
    return tuple(bias)


def parse_chat(data: object) -> ChatRequest:
    f = Fields(data)
    generation = parse_generation(f, chat=True)
    messages = f.array("messages")
    if not messages:
        raise BadRequest("`messages` must be a non-empty array", "messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise BadRequest(f"messages[{i}] must be an object with a string `role`", "messages")
    tools = f.array("tools")
    if tools is not None:
        _check_tools(tools)
    kv_params = f.mapping("kv_transfer_params") or {}
    prompt_ids = Fields(kv_params).token_ids("prompt_token_ids") if kv_params else None
    template_kwargs = dict(f.mapping("chat_template_kwargs") or {})
    effort = f.string("reasoning_effort")
    if effort is not None:
        # vLLM's render-time side effect: reasoning_effort decides enable_thinking when unset.
        template_kwargs.setdefault("enable_thinking", effort != "none")
        template_kwargs.setdefault("reasoning_effort", effort)
    continue_final = f.boolean("continue_final_message", False)
    add_prompt = f.boolean("add_generation_prompt", True)
    if continue_final and add_prompt:
        raise BadRequest(
            "`continue_final_message` needs `add_generation_prompt: false`",
            "continue_final_message",
        )
    return ChatRequest(
        generation=generation,
        messages=messages,
        tools=tools,
        tool_choice=_tool_choice(f, tools),
        add_generation_prompt=add_prompt,
        continue_final_message=continue_final,
        template_kwargs=template_kwargs,
        prompt_token_ids=prompt_ids or None,
    )


def _check_tools(tools: list[Any]) -> None:
    if not tools:
        raise BadRequest("`tools` must not be empty; leave it out instead", "tools")
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if (
            not isinstance(tool, dict)
            or tool.get("type", "function") != "function"
            or not isinstance(function, dict)
            or not isinstance(function.get("name"), str)
        ):
            raise BadRequest(
                f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ...}}}}", "tools"
            )


def _tool_choice(f: Fields, tools: list[Any] | None) -> str | dict[str, Any]:
    choice = f.data.get("tool_choice")
    if choice is None:
        return "auto" if tools else "none"
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise BadRequest(f"unknown `tool_choice` {choice!r}", "tool_choice")
        if choice != "none" and not tools:
            raise BadRequest("when using `tool_choice`, `tools` must be set", "tool_choice")
        return choice
    function = choice.get("function") if isinstance(choice, dict) else None
    if (
        not isinstance(choice, dict)
        or choice.get("type") != "function"
        or not isinstance(function, dict)
        or not isinstance(function.get("name"), str)
    ):
        raise BadRequest("`tool_choice` must be none, auto, required or a function", "tool_choice")
    names = {t["function"]["name"] for t in tools or ()}
    if function["name"] not in names:
        raise BadRequest(f"tool {function['name']!r} named in `tool_choice` is not in `tools`")
    return choice


def parse_completion(data: object) -> CompletionRequest:
    f = Fields(data)
    generation = parse_generation(f, chat=False)
    if f.boolean("echo", False):
        raise BadRequest("`echo` is not supported by this engine", "echo")
    if f.string("suffix"):
        raise BadRequest("`suffix` is not supported by this engine", "suffix")
    return CompletionRequest(
        generation=generation,
        prompts=_prompts(f.data.get("prompt")),
        add_special_tokens=f.boolean("add_special_tokens", True),
    )


def _prompts(prompt: object) -> list[str | list[int]]:
    """`prompt`: a string, a list of strings, a list of ids, or a list of id lists."""
    if isinstance(prompt, str):
        prompts: list[str | list[int]] = [prompt]
    elif is_id_list(prompt):
        prompts = [list(prompt)]  # type: ignore[call-overload]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        prompts = list(prompt)
    elif isinstance(prompt, list) and prompt and all(is_id_list(p) for p in prompt):
        prompts = [list(p) for p in prompt]
    else:
        raise BadRequest(
            "`prompt` must be a string, a list of strings, a list of token ids or a list of lists",
            "prompt",
        )
    if any(len(p) == 0 for p in prompts):
        raise BadRequest("`prompt` must not be empty", "prompt")
    return prompts
