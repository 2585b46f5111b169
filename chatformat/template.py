"""Chat messages → prompt text and ids through the tokenizer's (or a given) jinja chat template.

Messages are normalised the way vLLM does before templating: `content: null` becomes "", text
parts are joined, `reasoning`/`reasoning_content` are both set from either, tool-call arguments
are JSON-decoded to objects. Templates that mention `tools` get `tools=` and the messages as they
are; for the others (SmolLM2's) tools and tool calls are written in the hermes style (tools.py)
into the system prompt and the assistant turns, and tool results stay `tool` role turns.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from typing import Any

from jinja2 import TemplateError

from .errors import Unrenderable
from .tools import render_tool_call, tools_system_block


@dataclass(frozen=True)
class RenderedPrompt:
    text: str
    token_ids: list[int]


class ChatRenderer:
    def __init__(self, tokenizer: Any, template: str | None = None) -> None:
        self._tokenizer = tokenizer
        self._template = template
        source = template if template is not None else tokenizer.chat_template
        if isinstance(source, dict):
            source = " ".join(str(t) for t in source.values())
        self.has_template = bool(source)
        self.native_tools = bool(source) and "tools" in str(source)

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        template_kwargs: dict[str, Any] | None = None,
    ) -> RenderedPrompt:
        if not self.has_template:
            raise Unrenderable(
                "the model has no chat template; start the engine with --chat-template"
            )
        normal = normalize_messages(messages, fold_tool_calls=not self.native_tools)
        if tools and not self.native_tools:
            normal = _with_tools_in_system(normal, tools)
        kwargs = dict(template_kwargs or {})
        if tools and self.native_tools:
            kwargs["tools"] = tools
        try:
            text = self._tokenizer.apply_chat_template(
                normal,
                chat_template=self._template,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                tokenize=False,
                **kwargs,
            )
        except (TemplateError, TypeError, ValueError, KeyError, IndexError) as e:
            raise Unrenderable(f"the chat template could not render these messages: {e}") from e
        ids = self._tokenizer(text, add_special_tokens=False)["input_ids"]
        return RenderedPrompt(text=str(text), token_ids=list(ids))


def normalize_messages(
    messages: list[dict[str, Any]], fold_tool_calls: bool
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        normal = dict(message)
        normal["content"] = _text(message.get("content"), i)
        reasoning = message.get("reasoning")
        if reasoning is None:
            reasoning = message.get("reasoning_content")
        if reasoning is not None:
            normal["reasoning"] = normal["reasoning_content"] = reasoning
        calls = [_decoded_call(c, i) for c in message.get("tool_calls") or ()]
        normal.pop("tool_calls", None)
        if calls and fold_tool_calls:
            rendered = "\n".join(
                render_tool_call(c["function"]["name"], c["function"]["arguments"]) for c in calls
            )
            normal["content"] = (
                f"{normal['content']}\n{rendered}" if normal["content"] else rendered
            )
        elif calls:
            normal["tool_calls"] = calls
        out.append(normal)
    return out


def _text(content: object, index: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict) and part.get("type") in ("text", "input_text"):
                texts.append(str(part.get("text", "")))
            else:
                raise Unrenderable(f"messages[{index}]: only text content is supported", "messages")
        return "\n".join(texts)
    raise Unrenderable(f"messages[{index}].content must be a string or a list of parts", "messages")


def _decoded_call(call: object, index: int) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise Unrenderable(f"messages[{index}].tool_calls entries need function.name", "messages")
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        # vLLM keeps undecodable arguments as the string it got.
        with contextlib.suppress(json.JSONDecodeError):
            arguments = json.loads(arguments)
    return {**call, "function": {**function, "arguments": arguments}}  # type: ignore[dict-item]


def _with_tools_in_system(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    block = tools_system_block(tools)
    if messages and messages[0].get("role") == "system":
        first = dict(messages[0])
        first["content"] = f"{first['content']}\n\n{block}" if first["content"] else block
        return [first, *messages[1:]]
    return [{"role": "system", "content": block}, *messages]
