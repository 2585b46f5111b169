"""Token-in bridges against vLLM's own chat-template rendering: for the conversations of the
token-in tests, with the real SmolLM2 tokenizer, the prompt rolltap builds (the previous prompt,
the ids sampled, the bridge) is the ids vLLM's chat route would render and tokenize for the same
messages, wherever the template is append-only. Bridges come from rolltap's in-process renderer
(`--tokenizer`) and from `RemoteTemplate` asking a `/tokenize` that runs vLLM's code.

vLLM's path (vllm/renderers/online_renderer.py `preprocess_chat`, 0.33): the request's
`build_chat_params` with the tools (`tool.model_dump()`) and `tokenize=False` as defaults,
`parse_chat_messages` in the template's content format, `safe_apply_chat_template` to text, then
the tokenizer with the request's `build_tok_params(...).get_encode_kwargs()`. The model config
those functions read is a stand-in naming exactly the attributes they use (a vLLM release that
reads another fails here by name)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from rolltap.chatformat.template import ChatRenderer
from rolltap.proxy.tokenin.bridge import Bridges, LocalTemplate, RemoteTemplate
from tests.support.chats import QWEN3_STYLE, smollm2_tokenizer

pytestmark = pytest.mark.contract

SYSTEM = {"role": "system", "content": "You are terse."}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str | None, *calls: dict[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = list(calls)
    return message


def tool(text: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": "call_1", "content": text}


@dataclass(frozen=True)
class Conversation:
    template: Path | None
    """None: SmolLM2's own template."""
    tools: list[dict[str, Any]] | None
    turns: list[list[dict[str, Any]]]
    """The messages of each request after the first's, alternating with the answers: request
    messages, answer, new messages, answer, new messages..."""
    cut: bool = False
    """The answers are cut at their limit (no end of turn sampled): rolltap adds it."""


CONVERSATIONS = {
    # tests/proxy/test_token_in_lineage.py
    "plain": Conversation(
        None, None, [[SYSTEM, user("What is 2+2?")], [assistant("4")], [user("And doubled?")]]
    ),
    "cut-answer": Conversation(
        None,
        None,
        [[SYSTEM, user("Tell me a story.")], [assistant("Once upon a time")], [user("Go on.")]],
        cut=True,
    ),
    "three-turns": Conversation(
        None,
        None,
        [
            [SYSTEM, user("Name a colour.")],
            [assistant("Blue.")],
            [user("Another?")],
            [assistant("Green.")],
            [user("Thanks.")],
        ],
    ),
    # a tool call and its result under the Qwen3-style template (tests/support/templates)
    "tool-call": Conversation(
        QWEN3_STYLE,
        TOOLS,
        [
            [user("Weather in Paris?")],
            [assistant(None, CALL)],
            [tool("rainy")],
            [assistant("It is rainy.")],
            [user("And tomorrow?")],
        ],
    ),
}


class _ModelConfig:
    """What vLLM's rendering functions read of `ModelConfig` for a text-only HF model."""

    multimodal_config = None
    enable_prompt_embeds = False
    revision = None
    tokenizer_revision = None
    code_revision = None
    tokenizer = "smollm2"
    model = "smollm2"
    trust_remote_code = False
    max_model_len = 8192
    allowed_local_media_path = ""
    allowed_media_domains = None

    class hf_config:  # the attribute's name in vLLM
        model_type = "llama"


def vllm_render(
    tokenizer: Any,
    template: str | None,
    body: dict[str, Any],
    *,
    chat_route: bool,
) -> list[int]:
    """The ids vLLM renders for a chat request (`chat_route`) or a /tokenize request."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.serve.tokenize.protocol import TokenizeChatRequest
    from vllm.renderers.chat_utils.chat_message import parse_chat_messages
    from vllm.renderers.hf import resolve_chat_template_content_format, safe_apply_chat_template

    model = ChatCompletionRequest if chat_route else TokenizeChatRequest
    request = model.model_validate(body)
    tools = None if request.tools is None else [t.model_dump() for t in request.tools]
    params = request.build_chat_params(template, "auto").with_defaults(
        {"tools": tools, "tokenize": False}
    )
    config: Any = _ModelConfig
    content_format = resolve_chat_template_content_format(
        chat_template=params.chat_template,
        tools=params.chat_template_kwargs.get("tools"),
        given_format=params.chat_template_content_format,
        tokenizer=tokenizer,
        model_config=config,
    )
    conversation, _, _ = parse_chat_messages(
        request.messages, config, content_format=content_format
    )
    text = safe_apply_chat_template(
        config, tokenizer, conversation, **params.get_apply_chat_template_kwargs()
    )
    encode = request.build_tok_params(config).get_encode_kwargs()
    return list(tokenizer(text, **encode)["input_ids"])


def _vllm_tokenize(tokenizer: Any, template: str | None) -> web.Application:
    """vLLM's /tokenize for messages, as `RemoteTemplate` asks it."""

    async def tokenize(request: web.Request) -> web.Response:
        ids = vllm_render(tokenizer, template, orjson.loads(await request.read()), chat_route=False)
        return web.json_response({"count": len(ids), "max_model_len": 8192, "tokens": ids})

    app = web.Application()
    app.router.add_post("/tokenize", tokenize)
    return app


@pytest.mark.parametrize("bridged_by", ["rolltap", "vllm-tokenize"])
@pytest.mark.parametrize("name", list(CONVERSATIONS))
async def test_bridged_prompts_are_what_vllm_renders(
    vllm: None, name: str, bridged_by: str
) -> None:
    from vllm.tokenizers.hf import get_cached_tokenizer

    conversation = CONVERSATIONS[name]
    tokenizer = get_cached_tokenizer(smollm2_tokenizer())
    template = None if conversation.template is None else conversation.template.read_text()
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    tools = conversation.tools

    def rendered(messages: list[dict[str, Any]], generation: bool = True) -> list[int]:
        body = {
            "model": "m",
            "messages": messages,
            "tools": tools,
            "add_generation_prompt": generation,
        }
        return vllm_render(tokenizer, template, body, chat_route=True)

    server = TestServer(_vllm_tokenize(tokenizer, template))
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as session:
            if bridged_by == "rolltap":
                bridges = Bridges(LocalTemplate(ChatRenderer(tokenizer, template)))
            else:
                url = str(server.make_url("")).rstrip("/")
                bridges = Bridges(RemoteTemplate(session, url, "m"))
            messages = list(conversation.turns[0])
            prompt = rendered(messages)
            # rolltap's engine renders the first prompt as vLLM does.
            local = ChatRenderer(tokenizer, template).render(messages, tools).token_ids
            assert list(local) == prompt
            for answer, tail in zip(
                conversation.turns[1::2], conversation.turns[2::2], strict=True
            ):
                # The answer's ids: what the template writes for it, as the model sampled them.
                after = rendered([*messages, *answer], generation=False)
                assert after[: len(prompt)] == prompt, "the template is not append-only here"
                sampled = after[len(prompt) : after.index(end, len(prompt)) + 1]
                if conversation.cut:
                    sampled = sampled[:-1]
                    closing = await bridges.end_of_turn(sampled[-1], True, tools, None)
                    assert closing == [end]
                    sampled += closing
                bridge = await bridges.bridge(sampled[-1], tail, tools, None)
                assert isinstance(bridge, list), bridge
                messages += [*answer, *tail]
                assert prompt + sampled + bridge == rendered(messages)
                prompt = prompt + sampled + bridge
    finally:
        await server.close()
