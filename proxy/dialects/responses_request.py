"""A Responses API request (Codex's) as a chat completions request.

Conversation (`instructions` + `input` items), in order:
* `instructions` and the leading `system`/`developer` messages: one system message, joined by
  blank lines (chat templates of open models take a single leading system message);
* later `developer` messages: `system` messages in place; `user`/`system` messages as they are;
* `reasoning`, assistant `message`, `function_call`, `custom_tool_call` items: one assistant
  turn each run, a reasoning item opening a new turn (it comes first in every answer); restored to
  the engine's message when its `encrypted_content` is a valid rolltap handle (history.py);
* `function_call_output`, `custom_tool_call_output`: `tool` messages;
* `item_reference`: refused (422, nothing is stored server-side); hosted-tool items
  (`web_search_call`, `compaction`, ...): skipped and noted.

Tools: `function` as is; `custom` (free-form, e.g. apply_patch) as a function with one string
argument `input`, its grammar appended to the description; `namespace` tools flattened to
`<namespace>__<name>` (no `__` when the namespace ends in `_`); hosted tools (web_search, ...)
are left out: a chat engine cannot run them. These are Codex's own rules for chat providers.

Parameters: `max_output_tokens` -> `max_tokens`, `temperature`, `top_p`, `parallel_tool_calls`,
`reasoning.effort` -> `reasoning_effort`, `text.format` -> `response_format`; `store`,
`include`, `metadata`, `prompt_cache_key`, `client_metadata` and the like do not reach the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import BadRequest, Unprocessable
from .dialect import ChatPlan, Entry, expect, sampling, text_parts
from .history import HarnessTurn, ToolUse, dumps

FREEFORM_ARGUMENT = "input"
_SAMPLING = {
    "max_output_tokens": "max_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "parallel_tool_calls": "parallel_tool_calls",
}
_ASSISTANT_ITEMS = ("reasoning", "function_call", "custom_tool_call")
_OUTPUT_ITEMS = ("function_call_output", "custom_tool_call_output")


@dataclass(frozen=True)
class ToolSpec:
    name: str
    """The name the client knows (without namespace)."""
    custom: bool = False
    namespace: str | None = None


def chat_name(namespace: str | None, name: str) -> str:
    if not namespace:
        return name
    return f"{namespace}{name}" if namespace.endswith("_") else f"{namespace}__{name}"


def tool_specs(tools: list[Any] | None) -> dict[str, ToolSpec]:
    """Chat function name -> the client tool it stands for."""
    specs: dict[str, ToolSpec] = {}
    for tool in tools or ():
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind in ("function", "custom") and isinstance(tool.get("name"), str):
            specs[tool["name"]] = ToolSpec(tool["name"], custom=kind == "custom")
        elif kind == "namespace" and isinstance(tool.get("name"), str):
            for inner in tool.get("tools") or ():
                if isinstance(inner, dict) and inner.get("type") == "function":
                    name = chat_name(tool["name"], str(inner.get("name")))
                    specs[name] = ToolSpec(str(inner.get("name")), namespace=tool["name"])
    return specs


def plan(body: dict[str, Any]) -> ChatPlan:
    _validate(body)
    notes: list[str] = []
    params: dict[str, Any] = {"stream": body.get("stream") is True, **sampling(body, _SAMPLING)}
    if isinstance(body.get("model"), str):
        params["model"] = body["model"]
    # Tools a chat engine cannot run are left out without a note: the record keeps both the
    # client's request and the chat request, so the difference is there for anyone to see.
    tools = _tools(body.get("tools"))
    if tools:
        params["tools"] = tools
        choice = _tool_choice(body.get("tool_choice"))
        if choice is not None:
            params["tool_choice"] = choice
    else:
        params.pop("parallel_tool_calls", None)
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and isinstance(reasoning.get("effort"), str):
        params["reasoning_effort"] = reasoning["effort"]
    response_format = _response_format(body.get("text"))
    if response_format is not None:
        params["response_format"] = response_format
    return ChatPlan(params, _entries(body, notes), notes)


def _validate(body: dict[str, Any]) -> None:
    if body.get("previous_response_id") is not None or body.get("conversation") is not None:
        raise Unprocessable(
            "server-side conversation state is not supported: send the whole history in "
            "'input' (store=false)",
            param="previous_response_id",
            code="unsupported_parameter",
        )
    if body.get("background") is True:
        raise Unprocessable("background responses are not supported", param="background")
    if body.get("prompt") is not None:
        raise Unprocessable("stored prompt templates are not supported", param="prompt")
    if not isinstance(body.get("input"), str | list):
        raise BadRequest("'input' must be a string or an array of items", param="input")
    for key, types in (
        ("model", str),
        ("instructions", str),
        ("stream", bool),
        ("tools", list),
        ("tool_choice", (str, dict)),
        ("parallel_tool_calls", bool),
        ("reasoning", dict),
        ("text", dict),
        ("include", list),
        ("max_output_tokens", int),
        ("temperature", (int, float)),
        ("top_p", (int, float)),
    ):
        expect(body, key, types)
    if body.get("max_output_tokens") is not None and body["max_output_tokens"] < 1:
        raise BadRequest("'max_output_tokens' must be at least 1", param="max_output_tokens")
    for i, item in enumerate(body["input"] if isinstance(body["input"], list) else ()):
        _validate_item(i, item)
    for i, tool in enumerate(body.get("tools") or ()):
        if not isinstance(tool, dict) or not isinstance(tool.get("type"), str):
            raise BadRequest(f"tools[{i}] must be an object with a 'type'", param="tools")


def _validate_item(i: int, item: Any) -> None:
    if not isinstance(item, dict):
        raise BadRequest(f"input[{i}] must be an object", param="input")
    kind = item.get("type", "message")
    if kind == "message" and item.get("role") not in ("user", "assistant", "system", "developer"):
        raise BadRequest(
            f"input[{i}].role must be user, assistant, system or developer", param="input"
        )
    if kind in (*_ASSISTANT_ITEMS[1:], *_OUTPUT_ITEMS) and not isinstance(item.get("call_id"), str):
        raise BadRequest(f"input[{i}].call_id must be a string", param="input")


def _tools(tools: list[Any] | None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for tool in tools or ():
        kind = tool["type"]
        if kind == "function":
            out.append(_function(tool, None))
        elif kind == "custom":
            out.append(_freeform(tool))
        elif kind == "namespace":
            for inner in tool.get("tools") or ():
                if isinstance(inner, dict) and inner.get("type") == "function":
                    out.append(_function(inner, str(tool.get("name") or "")))
    return out


def _function(tool: dict[str, Any], namespace: str | None) -> dict[str, Any]:
    if not isinstance(tool.get("name"), str):
        raise BadRequest("a function tool needs a 'name'", param="tools")
    function: dict[str, Any] = {"name": chat_name(namespace, tool["name"])}
    if tool.get("description") is not None:
        function["description"] = tool["description"]
    function["parameters"] = tool.get("parameters") or {"type": "object", "properties": {}}
    if tool.get("strict") is True:
        function["strict"] = True
    return {"type": "function", "function": function}


def _freeform(tool: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(tool.get("name"), str):
        raise BadRequest("a custom tool needs a 'name'", param="tools")
    description = str(tool.get("description") or "")
    grammar: dict[str, Any] = tool["format"] if isinstance(tool.get("format"), dict) else {}
    if isinstance(grammar.get("definition"), str):
        description += (
            f"\n\nPass the raw tool input as the `{FREEFORM_ARGUMENT}` string argument. It must "
            f"conform to this {grammar.get('syntax') or 'text'} grammar:\n{grammar['definition']}"
        )
    parameters = {
        "type": "object",
        "properties": {
            FREEFORM_ARGUMENT: {"type": "string", "description": "Raw freeform input for the tool."}
        },
        "required": [FREEFORM_ARGUMENT],
        "additionalProperties": False,
    }
    return {
        "type": "function",
        "function": {"name": tool["name"], "description": description, "parameters": parameters},
    }


def _tool_choice(choice: Any) -> Any:
    if choice is None or choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict):
        kind = choice.get("type")
        if kind in ("function", "custom") and isinstance(choice.get("name"), str):
            return {"type": "function", "function": {"name": choice["name"]}}
        if kind == "allowed_tools" and choice.get("mode") in ("auto", "required"):
            # Chat has no allow-list; the mode is kept, the restriction is not.
            return choice["mode"]
    raise Unprocessable(
        f"tool_choice {choice!r} cannot be honoured by a chat engine", param="tool_choice"
    )


def _response_format(text: Any) -> dict[str, Any] | None:
    fmt = text.get("format") if isinstance(text, dict) else None
    if not isinstance(fmt, dict) or fmt.get("type") in (None, "text"):
        return None
    if fmt["type"] == "json_object":
        return {"type": "json_object"}
    if fmt["type"] == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    raise Unprocessable(f"text.format {fmt['type']!r} is not supported", param="text")


def _entries(body: dict[str, Any], notes: list[str]) -> list[Entry]:
    items = body["input"]
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    system: list[str] = [body["instructions"]] if body.get("instructions") else []
    start = 0
    for item in items:
        if item.get("type", "message") != "message" or item.get("role") not in (
            "system",
            "developer",
        ):
            break
        system.append(_plain_text(item.get("content")))
        start += 1
    entries: list[Entry] = []
    if system:
        entries.append({"role": "system", "content": "\n\n".join(s for s in system if s)})
    turn: HarnessTurn | None = None
    skipped: list[str] = []
    for item in items[start:]:
        kind = item.get("type", "message")
        role = item.get("role")
        if kind == "message" and role == "assistant":
            turn = turn or _open(entries)
            turn.text.append(_plain_text(item.get("content")))
        elif kind == "message":
            turn = None
            content = _content(item.get("content"))
            entries.append({"role": "system" if role == "developer" else role, "content": content})
        elif kind == "reasoning":
            if turn is None or turn.started or turn.token is not None:
                turn = _open(entries)
            turn.token = item.get("encrypted_content") or turn.token
            turn.reasoning.append(_reasoning_text(item))
        elif kind in ("function_call", "custom_tool_call"):
            turn = turn or _open(entries)
            turn.calls.append(_tool_use(item))
        elif kind in _OUTPUT_ITEMS:
            turn = None
            entries.append(
                {"role": "tool", "tool_call_id": str(item.get("call_id")), **_output(item)}
            )
        elif kind == "item_reference":
            raise Unprocessable(
                "item_reference needs server-side storage, which rolltap does not keep",
                param="input",
            )
        else:
            skipped.append(str(kind))
    if skipped:
        notes.append(f"input items a chat engine cannot take were skipped: {', '.join(skipped)}")
    return entries


def _open(entries: list[Entry]) -> HarnessTurn:
    turn = HarnessTurn()
    entries.append(turn)
    return turn


def _tool_use(item: dict[str, Any]) -> ToolUse:
    name = chat_name(item.get("namespace"), str(item.get("name")))
    if item["type"] == "custom_tool_call":
        arguments = dumps({FREEFORM_ARGUMENT: str(item.get("input") or "")})
    else:
        raw = item.get("arguments")
        arguments = raw if isinstance(raw, str) else dumps(raw or {})
    return ToolUse(str(item.get("call_id")), name, arguments)


def _reasoning_text(item: dict[str, Any]) -> str:
    """The raw reasoning (`content`), else the summaries: what the model thought, as sent."""
    parts = [c.get("text") or "" for c in item.get("content") or () if isinstance(c, dict)]
    if not any(parts):
        parts = [s.get("text") or "" for s in item.get("summary") or () if isinstance(s, dict)]
    return "".join(parts)


def _plain_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(
        str(p.get("text") or p.get("refusal") or "")
        for p in content or ()
        if isinstance(p, dict) and p.get("type") in ("input_text", "output_text", "text", "refusal")
    )


def _content(content: Any) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    parts: list[dict[str, Any]] = []
    for part in content or ():
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text"):
            parts.append({"type": "text", "text": str(part.get("text") or "")})
        elif kind == "input_image" and isinstance(part.get("image_url"), str):
            url: dict[str, Any] = {"url": part["image_url"]}
            if part.get("detail"):
                url["detail"] = part["detail"]
            parts.append({"type": "image_url", "image_url": url})
        else:
            raise Unprocessable(
                f"input content of type {kind!r} is not supported (text and image URLs are)",
                param="input",
            )
    return text_parts(parts) if parts else ""


def _output(item: dict[str, Any]) -> dict[str, Any]:
    output = item.get("output")
    if isinstance(output, str):
        return {"content": output}
    if isinstance(output, list):
        return {"content": _content(output)}
    if isinstance(output, dict) and isinstance(output.get("content"), str):
        return {"content": output["content"]}
    return {"content": dumps(output)}
