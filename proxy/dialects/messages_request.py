"""An Anthropic Messages request (Claude Code's) as a chat completions request.

Conversation, in order:
* `system` (a string or text blocks): the leading system message, blocks as text parts;
* a `system` message inside `messages` (Claude Code sends one): a system message in place;
* user messages: text and image blocks become the message's parts (a single text block a plain
  string); each `tool_result` becomes a `tool` message (its text; `is_error` has no chat
  equivalent and is dropped), in block order;
* assistant messages: `thinking` (its `signature`), `text` and `tool_use` blocks make one
  assistant turn, restored to the engine's message when the signature is a valid rolltap handle
  (history.py); a thinking block with another signature opens the next turn, so consecutive
  assistant messages of one answer stay one turn; `redacted_thinking` and server-tool blocks are
  skipped and noted.

Tools: `{name, description, input_schema}` -> function tools; Anthropic-defined tools (`type`
`bash_20250124`, `web_search_...`, ...) are left out. `tool_choice` auto/any/tool/none
-> auto/required/function/none, `disable_parallel_tool_use` -> `parallel_tool_calls: false`.

Parameters: `max_tokens`, `temperature`, `top_p`, `top_k`, `stop_sequences` -> `stop`,
`output_config.format` (JSON schema) -> `response_format`; a final assistant message (a prefill)
-> `continue_final_message: true, add_generation_prompt: false` (vLLM's way to continue it).
`thinking` does not reach the engine (the model's chat template decides whether it reasons);
`metadata`, `context_management`, `cache_control`, `output_config.effort` and betas neither.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import BadRequest, Unprocessable
from .dialect import ChatPlan, Entry, expect, sampling, text_parts
from .history import HarnessTurn, ToolUse, dumps

_SAMPLING = {
    "max_tokens": "max_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "stop_sequences": "stop",
}
_COMPACTION = "Your task is to create a detailed summary of the conversation so far"


def plan(body: dict[str, Any], *, counting: bool = False) -> ChatPlan:
    """`counting`: a count_tokens request, which has no max_tokens."""
    _validate(body, counting)
    notes: list[str] = []
    params: dict[str, Any] = {"stream": body.get("stream") is True, **sampling(body, _SAMPLING)}
    if isinstance(body.get("model"), str):
        params["model"] = body["model"]
    # Tools a chat engine cannot run are left out without a note: the record keeps both the
    # client's request and the chat request, so the difference is there for anyone to see.
    tools = _tools(body.get("tools"))
    if tools:
        params["tools"] = tools
        if body.get("tool_choice") is not None:
            params.update(_tool_choice(body["tool_choice"]))
    response_format = _response_format(body.get("output_config"))
    if response_format is not None:
        params["response_format"] = response_format
    if body["messages"][-1]["role"] == "assistant":
        # A prefill: the answer continues that message instead of starting a new turn.
        params["continue_final_message"] = True
        params["add_generation_prompt"] = False
    return ChatPlan(params, _entries(body, notes), notes)


def purpose(body: dict[str, Any], headers: Mapping[str, str]) -> str | None:
    """Claude Code's side requests, by their shape."""
    if body.get("max_tokens") == 1:
        return "probe"
    fmt = (body.get("output_config") or {}).get("format")
    schema = fmt.get("schema") if isinstance(fmt, dict) else None
    if isinstance(schema, dict) and "title" in (schema.get("properties") or {}):
        return "title"
    messages = body.get("messages") or []
    last = messages[-1] if messages and isinstance(messages[-1], dict) else {}
    if last.get("role") == "user" and _COMPACTION in _plain_text(last.get("content")):
        return "compact"
    return None


def _validate(body: dict[str, Any], counting: bool) -> None:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages: must be a non-empty array", param="messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in (
            "user",
            "assistant",
            "system",
        ):
            raise BadRequest(
                f"messages.{i}: must be an object with role user or assistant", param="messages"
            )
        if not isinstance(message.get("content"), str | list):
            raise BadRequest(
                f"messages.{i}.content: must be a string or an array of blocks", param="messages"
            )
        for j, block in enumerate(
            message["content"] if isinstance(message["content"], list) else ()
        ):
            _validate_block(f"messages.{i}.content.{j}", block)
    if not counting and body.get("max_tokens") is None:
        raise BadRequest("max_tokens: Field required", param="max_tokens")
    for key, types in (
        ("model", str),
        ("system", (str, list)),
        ("max_tokens", int),
        ("stream", bool),
        ("temperature", (int, float)),
        ("top_p", (int, float)),
        ("top_k", int),
        ("stop_sequences", list),
        ("tools", list),
        ("tool_choice", dict),
        ("thinking", dict),
        ("metadata", dict),
        ("output_config", dict),
    ):
        expect(body, key, types)
    if body.get("max_tokens") is not None and body["max_tokens"] < 1:
        raise BadRequest("max_tokens: must be at least 1", param="max_tokens")
    for i, tool in enumerate(body.get("tools") or ()):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise BadRequest(f"tools.{i}: must be an object with a 'name'", param="tools")


def _validate_block(where: str, block: Any) -> None:
    if not isinstance(block, dict) or not isinstance(block.get("type"), str):
        raise BadRequest(f"{where}: a block needs a 'type'", param="messages")
    needed = {"tool_use": ("id", "name"), "tool_result": ("tool_use_id",)}.get(block["type"], ())
    for key in needed:
        if not isinstance(block.get(key), str):
            raise BadRequest(f"{where}.{key}: Field required", param="messages")


def _tools(tools: list[Any] | None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for tool in tools or ():
        if tool.get("type") not in (None, "custom"):
            continue
        function: dict[str, Any] = {"name": tool["name"]}
        if tool.get("description") is not None:
            function["description"] = tool["description"]
        function["parameters"] = tool.get("input_schema") or {"type": "object", "properties": {}}
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: dict[str, Any]) -> dict[str, Any]:
    kind = choice.get("type", "auto")
    out: dict[str, Any] = {}
    if kind == "auto":
        out["tool_choice"] = "auto"
    elif kind == "any":
        out["tool_choice"] = "required"
    elif kind == "none":
        out["tool_choice"] = "none"
    elif kind == "tool" and isinstance(choice.get("name"), str):
        out["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    else:
        raise BadRequest(f"tool_choice: unknown type {kind!r}", param="tool_choice")
    if choice.get("disable_parallel_tool_use") is True:
        out["parallel_tool_calls"] = False
    return out


def _response_format(config: Any) -> dict[str, Any] | None:
    fmt = config.get("format") if isinstance(config, dict) else None
    if not isinstance(fmt, dict):
        return None
    if fmt.get("type") == "json_schema" and isinstance(fmt.get("schema"), dict):
        return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}
    raise Unprocessable(f"output_config.format {fmt.get('type')!r} is not supported")


def _entries(body: dict[str, Any], notes: list[str]) -> list[Entry]:
    entries: list[Entry] = []
    system = body.get("system")
    if system:
        entries.append({"role": "system", "content": _system_content(system)})
    skipped: list[str] = []
    turn: HarnessTurn | None = None
    for message in body["messages"]:
        role, content = message["role"], message["content"]
        if role == "assistant":
            blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
            turn = _assistant(blocks, turn, entries, skipped)
            continue
        turn = None
        if role == "system":
            entries.append({"role": "system", "content": _system_content(content)})
        elif isinstance(content, str):
            entries.append({"role": "user", "content": content})
        else:
            _user(content, entries, skipped)
    if skipped:
        notes.append(f"content blocks a chat engine cannot take were skipped: {', '.join(skipped)}")
    return entries


def _assistant(
    blocks: list[dict[str, Any]],
    turn: HarnessTurn | None,
    entries: list[Entry],
    skipped: list[str],
) -> HarnessTurn:
    for block in blocks:
        kind = block["type"]
        if kind == "thinking":
            token = block.get("signature") or None
            if (
                turn is None
                or (token is not None and token != turn.token)
                or (token is None and turn.started)
            ):
                turn = _open(entries)
            turn.token = token or turn.token
            turn.reasoning.append(str(block.get("thinking") or ""))
            continue
        turn = turn or _open(entries)
        if kind == "text":
            turn.text.append(str(block.get("text") or ""))
        elif kind == "tool_use":
            arguments = dumps(block.get("input") if block.get("input") is not None else {})
            turn.calls.append(ToolUse(str(block.get("id")), str(block.get("name")), arguments))
        else:
            skipped.append(kind)
    return turn or _open(entries)


def _open(entries: list[Entry]) -> HarnessTurn:
    turn = HarnessTurn()
    entries.append(turn)
    return turn


def _user(blocks: list[dict[str, Any]], entries: list[Entry], skipped: list[str]) -> None:
    parts: list[dict[str, Any]] = []
    for block in blocks:
        kind = block["type"]
        if kind == "tool_result":
            if parts:
                entries.append({"role": "user", "content": text_parts(parts)})
                parts = []
            entries.append(
                {
                    "role": "tool",
                    "tool_call_id": str(block.get("tool_use_id")),
                    "content": _tool_result(block.get("content"), skipped),
                }
            )
        elif kind == "text":
            parts.append({"type": "text", "text": str(block.get("text") or "")})
        elif kind == "image":
            parts.append(_image(block))
        else:
            skipped.append(kind)
    if parts:
        entries.append({"role": "user", "content": text_parts(parts)})


def _tool_result(content: Any, skipped: list[str]) -> str | list[dict[str, Any]]:
    if content is None or isinstance(content, str):
        return content or ""
    parts: list[dict[str, Any]] = []
    for block in content:
        if isinstance(block, dict) and block.get("type") == "text":
            parts.append({"type": "text", "text": str(block.get("text") or "")})
        elif isinstance(block, dict) and block.get("type") == "image":
            parts.append(_image(block))
        else:
            skipped.append(f"tool_result.{(block or {}).get('type')}")
    return text_parts(parts) if parts else ""


def _image(block: dict[str, Any]) -> dict[str, Any]:
    source = block.get("source") or {}
    if source.get("type") == "base64":
        url = f"data:{source.get('media_type')};base64,{source.get('data')}"
    elif source.get("type") == "url":
        url = str(source.get("url"))
    else:
        raise Unprocessable(f"image source {source.get('type')!r} is not supported")
    return {"type": "image_url", "image_url": {"url": url}}


def _system_content(system: Any) -> str | list[dict[str, Any]]:
    if isinstance(system, str):
        return system
    parts = [
        {"type": "text", "text": str(b.get("text") or "")}
        for b in system
        if isinstance(b, dict) and b.get("type") == "text"
    ]
    return text_parts(parts) if parts else ""


def _plain_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    blocks = [b for b in content or () if isinstance(b, dict) and b.get("type") == "text"]
    return "".join(str(b.get("text") or "") for b in blocks)
