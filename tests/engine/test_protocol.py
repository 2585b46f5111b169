"""Request bodies → typed requests; every bad field is a 400 that names it."""

from __future__ import annotations

from typing import Any

import pytest

from rolltap.engine.errors import BadRequest
from rolltap.engine.protocol import parse_chat, parse_completion

MESSAGES = [{"role": "user", "content": "hi"}]
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {}}}]


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": MESSAGES, **fields}


def test_chat_defaults() -> None:
    req = parse_chat(chat())
    g = req.generation
    assert (g.n, g.max_tokens, g.stream, g.logprobs, g.return_token_ids) == (
        1,
        None,
        False,
        False,
        False,
    )
    assert g.params.temperature == 1.0
    assert req.tool_choice == "none"
    assert req.add_generation_prompt is True


def test_chat_fields_are_read() -> None:
    req = parse_chat(
        chat(
            temperature=0,
            top_p=0.5,
            top_k=-1,
            seed=7,
            n=3,
            max_completion_tokens=9,
            stop="x",
            stop_token_ids=[2],
            logprobs=True,
            top_logprobs=2,
            return_token_ids=True,
            stream=True,
            stream_options={"include_usage": True},
            tools=TOOLS,
            reasoning_effort="none",
            kv_transfer_params={"prompt_token_ids": [1, 2, 3]},
        )
    )
    g = req.generation
    assert (g.params.greedy, g.params.top_k, g.params.seed) == (True, 0, 7)
    assert g.params.top_logprobs == 2
    assert (g.n, g.max_tokens, g.stop, g.stop_token_ids) == (3, 9, ("x",), frozenset({2}))
    assert (g.include_usage, g.stream, g.return_token_ids) == (True, True, True)
    assert req.tool_choice == "auto"
    assert req.template_kwargs["enable_thinking"] is False
    assert req.prompt_token_ids == [1, 2, 3]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"messages": []}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"messages": [{"content": "no role"}]}, "messages"),
        ({"temperature": "hot"}, "temperature"),
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 2.5}, "max_tokens"),
        ({"n": 0}, "n"),
        ({"n": True}, "n"),
        ({"stop": 3}, "stop"),
        ({"stop": ["a", 1]}, "stop"),
        ({"stop_token_ids": ["a"]}, "stop_token_ids"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"logprobs": "yes"}, "logprobs"),
        ({"stream": "yes"}, "stream"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"tools": []}, "tools"),
        ({"tools": [{"type": "function"}]}, "tools"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": {"type": "function"}}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": 3}, "tool_choice"),
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"logit_bias": {"x": 1}}, "logit_bias"),
        ({"prompt_logprobs": 1}, "prompt_logprobs"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"continue_final_message": True}, "continue_final_message"),
    ],
)
def test_chat_rejects(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(BadRequest) as info:
        parse_chat(chat(**fields))
    assert info.value.param == param
    assert info.value.body()["error"]["type"] == "BadRequestError"


def test_named_tool_choice_must_name_a_given_tool() -> None:
    choice = {"type": "function", "function": {"name": "g"}}
    with pytest.raises(BadRequest):
        parse_chat(chat(tools=TOOLS, tool_choice=choice))
    assert parse_chat(chat(tools=TOOLS, tool_choice={**choice, "function": {"name": "f"}}))


@pytest.mark.parametrize("body", [[], "text", None, 3])
def test_body_must_be_an_object(body: Any) -> None:
    with pytest.raises(BadRequest):
        parse_chat(body)


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("hello", ["hello"]),
        (["a", "b"], ["a", "b"]),
        ([1, 2, 3], [[1, 2, 3]]),
        ([[1, 2], [3]], [[1, 2], [3]]),
    ],
)
def test_completion_prompt_shapes(prompt: Any, expected: list[Any]) -> None:
    req = parse_completion({"prompt": prompt})
    assert req.prompts == expected
    assert req.generation.max_tokens == 16
    assert req.generation.logprobs is False


@pytest.mark.parametrize(
    "fields",
    [
        {"prompt": ""},
        {"prompt": []},
        {"prompt": [[]]},
        {"prompt": [1, "a"]},
        {"prompt": [-1]},
        {"prompt": 3},
        {"prompt": "x", "logprobs": 21},
        {"prompt": "x", "echo": True},
        {},
    ],
)
def test_completion_rejects(fields: dict[str, Any]) -> None:
    with pytest.raises(BadRequest):
        parse_completion(fields)


def test_completion_logprobs_is_a_count() -> None:
    g = parse_completion({"prompt": "x", "logprobs": 3}).generation
    assert (g.logprobs, g.params.top_logprobs) == (True, 3)
