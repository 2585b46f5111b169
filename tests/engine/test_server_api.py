"""The non-generating routes and OpenAI-style errors; the server stays up after each error."""

from __future__ import annotations

from typing import Any

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI

from rolltap import __version__
from rolltap.engine.launch import EngineProcess
from tests.support.engine import get_json, post_json

pytestmark = pytest.mark.model

MESSAGES = [{"role": "user", "content": "hi"}]
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {}}}]


async def test_health_models_version(smollm_engine: EngineProcess) -> None:
    assert (await get_json(smollm_engine.url, "/health")) == (200, None)
    status, models = await get_json(smollm_engine.url, "/v1/models")
    assert status == 200
    assert [m["id"] for m in models["data"]] == [smollm_engine.model] == ["SmolLM2-135M-Instruct"]
    assert models["data"][0]["max_model_len"] == 8192
    assert (await get_json(smollm_engine.url, "/version")) == (
        200,
        {"version": __version__, "engine": "rolltap"},
    )


async def test_tokenize_and_detokenize_text(smollm_engine: EngineProcess, tokenizer: Any) -> None:
    status, tokenized = await post_json(
        smollm_engine.url, "/tokenize", {"prompt": "Hello world", "return_token_strs": True}
    )
    assert status == 200
    assert tokenized["tokens"] == tokenizer("Hello world")["input_ids"]
    assert tokenized["token_strs"] == tokenizer.convert_ids_to_tokens(tokenized["tokens"])
    status, detokenized = await post_json(
        smollm_engine.url, "/detokenize", {"tokens": [1, *tokenized["tokens"], 2]}
    )
    assert status == 200
    assert detokenized == {"prompt": "<|im_start|>Hello world<|im_end|>"}


async def test_tokenize_messages_with_tools_renders_them(smollm_engine: EngineProcess) -> None:
    status, plain = await post_json(smollm_engine.url, "/tokenize", {"messages": MESSAGES})
    status, with_tools = await post_json(
        smollm_engine.url, "/tokenize", {"messages": MESSAGES, "tools": TOOLS}
    )
    assert status == 200
    assert with_tools["count"] > plain["count"]


@pytest.mark.parametrize(
    ("path", "body", "status", "error_type", "param"),
    [
        ("/v1/chat/completions", b"{not json", 400, "BadRequestError", None),
        ("/v1/chat/completions", b"[1, 2]", 400, "BadRequestError", None),
        ("/v1/chat/completions", {"messages": "hi"}, 400, "BadRequestError", "messages"),
        (
            "/v1/chat/completions",
            {"messages": MESSAGES, "temperature": "x"},
            400,
            "BadRequestError",
            "temperature",
        ),
        (
            "/v1/chat/completions",
            {"messages": MESSAGES, "max_tokens": -1},
            400,
            "BadRequestError",
            "max_tokens",
        ),
        (
            "/v1/chat/completions",
            {"messages": MESSAGES, "tools": []},
            400,
            "BadRequestError",
            "tools",
        ),
        (
            "/v1/chat/completions",
            {"messages": MESSAGES, "tools": TOOLS, "tool_choice": "maybe"},
            400,
            "BadRequestError",
            "tool_choice",
        ),
        ("/v1/chat/completions", {"messages": MESSAGES, "n": 99}, 400, "BadRequestError", None),
        (
            "/v1/chat/completions",
            {"messages": MESSAGES, "max_tokens": 9000},
            400,
            "BadRequestError",
            "max_tokens",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi " * 9000}]},
            400,
            "BadRequestError",
            None,
        ),
        (
            "/v1/chat/completions",
            {"messages": MESSAGES, "model": "gpt-9"},
            404,
            "NotFoundError",
            "model",
        ),
        (
            "/v1/chat/completions",
            {"messages": MESSAGES, "cache_salt": ""},
            400,
            "BadRequestError",
            "cache_salt",
        ),
        (
            # The chat format refuses it (chatformat/errors.py); the engine answers its 400.
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            400,
            "BadRequestError",
            "messages",
        ),
        (
            "/tokenize",
            {"messages": [{"role": "user", "content": 7}]},
            400,
            "BadRequestError",
            "messages",
        ),
        ("/v1/completions", {"prompt": [99999999]}, 400, "BadRequestError", "prompt"),
        ("/v1/completions", {"prompt": {"a": 1}}, 400, "BadRequestError", "prompt"),
        ("/v1/completions", {"prompt": "x", "model": "nope"}, 404, "NotFoundError", "model"),
        ("/detokenize", {"tokens": "abc"}, 400, "BadRequestError", "tokens"),
        ("/tokenize", {}, 400, "BadRequestError", "prompt"),
        ("/v1/nothing-here", {}, 404, "NotFoundError", None),
    ],
)
async def test_bad_requests_get_openai_errors(
    smollm_engine: EngineProcess,
    path: str,
    body: object,
    status: int,
    error_type: str,
    param: str | None,
) -> None:
    async with aiohttp.ClientSession() as session:
        kwargs: dict[str, Any] = {"data": body} if isinstance(body, bytes) else {"json": body}
        async with session.post(smollm_engine.url + path, **kwargs) as resp:
            answer = await resp.json()
            assert resp.status == status
    error = answer["error"]
    assert error["type"] == error_type
    assert error["code"] == status
    assert error["param"] == param
    assert isinstance(error["message"], str)
    assert error["message"]
    assert (await get_json(smollm_engine.url, "/health"))[0] == 200


async def test_wrong_method_is_405(smollm_engine: EngineProcess) -> None:
    status, answer = await get_json(smollm_engine.url, "/v1/chat/completions")
    assert status == 405
    assert answer["error"]["code"] == 405


async def test_too_large_body_is_413(smollm_engine: EngineProcess) -> None:
    body = b'{"prompt": "' + b"a" * (64 * 1024 * 1024 + 1) + b'"}'
    async with (
        aiohttp.ClientSession() as session,
        session.post(smollm_engine.url + "/v1/completions", data=body) as resp,
    ):
        assert resp.status == 413
        answer = await resp.json()
    assert answer["error"]["type"] == "RequestEntityTooLargeError"
    assert (await get_json(smollm_engine.url, "/health"))[0] == 200


async def test_sdk_raises_typed_errors(smollm_engine: EngineProcess) -> None:
    client = AsyncOpenAI(base_url=smollm_engine.url + "/v1", api_key="unused", max_retries=0)
    async with client:
        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.create(model="nope", messages=MESSAGES)  # type: ignore[arg-type]
        with pytest.raises(openai.BadRequestError) as info:
            await client.chat.completions.create(
                model=smollm_engine.model,
                messages=MESSAGES,  # type: ignore[arg-type]
                tools=[],
            )
    assert "tools" in str(info.value)
