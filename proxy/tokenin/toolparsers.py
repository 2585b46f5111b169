"""Tool-call parsers for generated text, by vLLM's `--tool-call-parser` names.

Each takes the request's tools (qwen3_coder needs the parameter types) and splits text pushed
piece by piece into content strings and calls (`CallPart`s), in order. Streamed, a call is
sent as it is written, its name first and then its arguments in fragments, as vLLM's parsers
do (callstream.py). Text that looks like a call but does not parse is handed back as content,
verbatim, as vLLM leaves it (a streamed call that breaks after its name went out excepted):

- hermes: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Hermes 2 Pro, Qwen2.5,
  Qwen3), any number, with content around them.
- qwen3_coder: `<tool_call><function=NAME><parameter=KEY>VALUE</parameter>...</function>
  </tool_call>`, values as raw text typed by the tool's JSON schema (Qwen3-Coder).
- llama3_json: the whole answer is `{"name": ..., "parameters": {...}}` (Llama 3.1/3.2 JSON
  tool calling), optionally after `<|python_tag|>`, several separated by `;`.
- mistral: content, then `[TOOL_CALLS]` and either a JSON list of `{"name", "arguments"}`
  (tokenizer versions before v11) or `NAME[ARGS]{...}` repeated (v11 and later).
"""

from __future__ import annotations

import json
import re
import secrets
import string
from collections.abc import Callable
from typing import Any, Protocol

from rolltap.engine.tools import CLOSE, OPEN, ToolCall, parse_outcome, read_block
from rolltap.proxy.tokenin.callstream import (
    HEAD_LIMIT,
    CallPart,
    CallSequence,
    JsonEcho,
    Piece,
    StreamedCalls,
    TagScanner,
    new_call_id,
)


class ToolParser(Protocol):
    def push(self, text: str) -> list[Piece]: ...

    def finish(self) -> list[Piece]: ...

    @property
    def outcome(self) -> str:
        """Whether the calls written so far parsed (engine.tools.parse_outcome)."""
        ...


def _call(name: str, arguments: dict[str, Any], call_id: str | None = None) -> ToolCall:
    return ToolCall(
        id=call_id or new_call_id(),
        name=name,
        arguments=json.dumps(arguments, ensure_ascii=False),
    )


# -- qwen3_coder ---------------------------------------------------------------------------------


def _schema_types(tools: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Tool name -> its parameters' JSON schemas."""
    out: dict[str, dict[str, Any]] = {}
    for tool in tools:
        function = tool.get("function", tool) if isinstance(tool, dict) else {}
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            continue
        parameters = function.get("parameters") or {}
        props = parameters.get("properties") if isinstance(parameters, dict) else None
        out[function["name"]] = props if isinstance(props, dict) else {}
    return out


def _typed(value: str, schema: Any) -> Any:
    """A parameter's raw text as its schema's type; text that is not that type stays text."""
    kind = schema.get("type") if isinstance(schema, dict) else None
    if kind == "string":
        return value
    if value.lower() == "null":
        return None
    if kind == "integer":
        try:
            return int(value)
        except ValueError:
            return value
    if kind == "number":
        try:
            number = float(value)
        except ValueError:
            return value
        return int(number) if number.is_integer() and "." not in value else number
    if kind == "boolean":
        lowered = value.lower()
        return lowered == "true" if lowered in ("true", "false") else value
    try:
        return json.loads(value)
    except ValueError:
        return value


_FUNCTION_OPEN = "<function="
_FUNCTION_CLOSE = "</function>"
_PARAMETER = "<parameter="


class _Qwen3CoderReader:
    """`<function=NAME>` then parameters, read as they are written: the call opens at the name
    with `{`, and each parameter's `"key": value` is settled once its `</parameter>` is. A whole
    block is read by the same steps (`parse`), so both read the format alike."""

    def __init__(self, types: dict[str, dict[str, Any]]) -> None:
        self._types = types
        self._name: str | None = None
        self._state = "head"
        """head | between (parameters) | value | done | stuck (nothing more is sent)"""
        self._text = ""
        """Unread text of the head or between parameters (once done: what followed)."""
        self._key = ""
        self._value = TagScanner("</parameter>")
        self._chunks: list[str] = []
        self._found: list[tuple[str, Any]] = []

    def grow(self, text: str) -> tuple[str, str] | None:
        more: list[str] = []
        while text and self._state not in ("done", "stuck"):
            if self._state == "value":
                before, after = self._value.feed(text)
                self._chunks.append(before)
                if after is None:
                    break
                more.append(self._parameter())
                text, self._state = after, "between"
                continue
            rest = (self._text + text).lstrip()
            text, self._text = "", rest
            if self._state == "head":
                text = self._head(rest, more)
            elif rest.startswith(_PARAMETER):
                key, opened, after = rest[len(_PARAMETER) :].partition(">")
                if opened and not key.strip():
                    self._state = "stuck"
                elif opened:
                    self._key, self._text, text = key.strip(), "", after
                    self._value, self._chunks, self._state = TagScanner("</parameter>"), [], "value"
            elif rest.startswith(_FUNCTION_CLOSE):
                more.append("}")
                self._text, self._state = rest[len(_FUNCTION_CLOSE) :], "done"
            elif not (_PARAMETER.startswith(rest) or _FUNCTION_CLOSE.startswith(rest)):
                self._state = "stuck"
        return None if self._name is None else (self._name, "".join(more))

    def _head(self, rest: str, more: list[str]) -> str:
        """Read the `<function=NAME>` head; what follows it."""
        if not rest.startswith(_FUNCTION_OPEN):
            if not _FUNCTION_OPEN.startswith(rest):
                self._state = "stuck"
            return ""
        name, found, after = rest[len(_FUNCTION_OPEN) :].partition(">")
        if not found:
            if len(rest) > HEAD_LIMIT:
                self._state = "stuck"
            return ""
        if not name.strip():
            self._state = "stuck"
            return ""
        self._name, self._text, self._state = name.strip(), "", "between"
        more.append("{")
        return after

    def _parameter(self) -> str:
        # The template writes each value between newlines; those are not the value.
        value = "".join(self._chunks).removeprefix("\n").removesuffix("\n")
        typed = _typed(value, self._types.get(self._name or "", {}).get(self._key))
        self._found.append((self._key, typed))
        comma = ", " if len(self._found) > 1 else ""
        return f"{comma}{_json(self._key)}: {_json(typed)}"

    def parse(self, body: str) -> ToolCall | str:
        whole = _Qwen3CoderReader(self._types)
        whole.grow(body)
        if whole._name is None:
            return "no <function=NAME>"
        if whole._state == "stuck":
            return "not <parameter=KEY>VALUE</parameter> (a name is empty or text is stray)"
        if whole._state != "done":
            return "no </function>"
        if whole._text.strip():
            return "text after </function>"
        return _call(whole._name, dict(whole._found))


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _qwen3_coder(tools: list[dict[str, Any]], stream: bool) -> ToolParser:
    types = _schema_types(tools)
    return StreamedCalls(OPEN, CLOSE, lambda: _Qwen3CoderReader(types), stream=stream)


# -- hermes --------------------------------------------------------------------------------------

_JSON_HEAD = re.compile(
    r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*'
)


class _HermesReader:
    """`{"name": NAME, "arguments": {...}}`: the call opens once its arguments begin, which
    then stream as json.dumps writes them (arguments given as a JSON string, which the format
    allows, are sent whole at the end)."""

    def __init__(self) -> None:
        self._head = ""
        self._name: str | None = None
        self._arguments = JsonEcho(object_only=True)

    def grow(self, text: str) -> tuple[str, str] | None:
        if self._name is None:
            self._head += text
            head = self._head.lstrip()
            match = _JSON_HEAD.match(head)
            if match is None:
                if len(head) > HEAD_LIMIT:
                    self._arguments.broken = True
                return None
            try:
                self._name = json.loads('"' + match.group(1) + '"')
            except ValueError:
                return None
            text, self._head = head[match.end() :], ""
        assert self._name is not None
        echo = self._arguments
        return self._name, "" if echo.broken or echo.done else echo.feed(text)

    def parse(self, body: str) -> ToolCall | str:
        return read_block(body)


def _hermes(tools: list[dict[str, Any]], stream: bool) -> ToolParser:
    return StreamedCalls(OPEN, CLOSE, _HermesReader, stream=stream)


# -- llama3_json ---------------------------------------------------------------------------------

_PYTHON_TAG = "<|python_tag|>"


class _Llama3Json:
    """An answer that opens with `{` (or the python tag) is calls, any other is content as it
    arrives. Calls are read whole at the end; streamed (`stream`), each also opens at its name
    and streams its arguments, as vLLM's llama3_json parser does."""

    def __init__(self, stream: bool) -> None:
        self._parts: list[str] = []
        self._mode: str | None = None  # None: undecided; "content"; "calls"
        self._calls = CallSequence(_JSON_HEAD, json_name=True, closer="}", separators=(";",))
        self._stream = stream
        self._read: list[ToolCall] | str = []

    @property
    def outcome(self) -> str:
        return _outcome(self._read)

    def push(self, text: str) -> list[Piece]:
        if self._mode == "content":
            return [text] if text else []
        self._parts.append(text)
        if self._mode is None:
            head = "".join(self._parts).lstrip()
            if not head or _PYTHON_TAG.startswith(head):
                return []
            self._mode = "calls" if head.startswith(("{", _PYTHON_TAG)) else "content"
            if self._mode == "content":
                out, self._parts = "".join(self._parts), []
                return [out]
            text = head.removeprefix(_PYTHON_TAG)
        return list(self._calls.push(text)) if self._stream else []

    def finish(self) -> list[Piece]:
        text, self._parts = "".join(self._parts), []
        if self._mode != "calls":
            return [text] if text else []
        read = self._read = _llama3_calls(text.strip().removeprefix(_PYTHON_TAG))
        calls = None if isinstance(read, str) else read
        if self._calls.opened:
            return list(self._calls.settle(calls))
        return [CallPart.whole(c) for c in calls] if calls else [text]


def _outcome(read: list[ToolCall] | str) -> str:
    """The outcome of calls read whole (a list), or of text that is not calls (why)."""
    return parse_outcome(0, read) if isinstance(read, str) else parse_outcome(len(read), None)


def _llama3_calls(text: str) -> list[ToolCall] | str:
    """The calls, or why the text is not calls."""
    decoder = json.JSONDecoder()
    calls: list[ToolCall] = []
    rest = text.strip()
    while rest:
        try:
            value, end = decoder.raw_decode(rest)
        except ValueError as e:
            return f"call {len(calls) + 1}: not JSON ({e})"
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            return f"call {len(calls) + 1}: not an object with a name"
        arguments = value.get("parameters", value.get("arguments", {}))
        if not isinstance(arguments, dict):
            return f"call {len(calls) + 1}: parameters are not an object"
        calls.append(_call(value["name"], arguments))
        rest = rest[end:].strip()
        if rest.startswith(";"):
            rest = rest[1:].strip()
        elif rest:
            return f"call {len(calls)}: text after it that is no call"
    return calls or "no call"


def _llama3_json(tools: list[dict[str, Any]], stream: bool) -> ToolParser:
    return _Llama3Json(stream)


# -- mistral -------------------------------------------------------------------------------------

_TOOL_CALLS = "[TOOL_CALLS]"
_ARGS = "[ARGS]"
_ID_CHARS = string.ascii_letters + string.digits


def _mistral_id() -> str:
    """Mistral's tool-call ids: nine letters and digits (its templates refuse others)."""
    return "".join(secrets.choice(_ID_CHARS) for _ in range(9))


_V11_HEAD = re.compile(r"([^\[\]{}]+?)\[ARGS\]")
"""Mistral's tokenizer v11 and later: `NAME[ARGS]` before each call's arguments."""


class _Mistral:
    """Content up to `[TOOL_CALLS]`; from there to the end, calls read at the end. Streamed
    (`stream`), each also opens at its name and streams its arguments, in either format."""

    def __init__(self, stream: bool) -> None:
        self._content = TagScanner(_TOOL_CALLS)
        self._parts: list[str] | None = None
        """The text after `[TOOL_CALLS]`; None before it."""
        self._stream = stream
        self._sequence: CallSequence | None = None
        self._read: list[ToolCall] | str = []

    @property
    def outcome(self) -> str:
        return _outcome(self._read)

    def push(self, text: str) -> list[Piece]:
        if self._parts is not None:
            self._parts.append(text)
            return self._stream_calls(text)
        out, rest = self._content.feed(text)
        pieces: list[Piece] = [out] if out else []
        if rest is not None:
            self._parts = [rest]
            pieces += self._stream_calls(rest)
        return pieces

    def _stream_calls(self, text: str) -> list[Piece]:
        if not self._stream:
            return []
        if self._sequence is None:
            begun = "".join(self._parts or ()).lstrip()
            if not begun:
                return []
            if begun.startswith("["):  # a JSON list, before tokenizer v11
                self._sequence = CallSequence(
                    _JSON_HEAD, json_name=True, closer="}", separators=(",",), opening="[",
                    ending="]", new_id=_mistral_id,
                )  # fmt: skip
            else:
                self._sequence = CallSequence(
                    _V11_HEAD, json_name=False, closer="", separators=(_TOOL_CALLS,),
                    new_id=_mistral_id,
                )  # fmt: skip
            text = begun
        return list(self._sequence.push(text))

    def finish(self) -> list[Piece]:
        if self._parts is None:
            text = self._content.held()
            return [text] if text else []
        text, self._parts = "".join(self._parts), None
        read = self._read = _mistral_calls(text)
        calls = None if isinstance(read, str) else read
        if self._sequence is not None and self._sequence.opened:
            return list(self._sequence.settle(calls))
        return [CallPart.whole(c) for c in calls] if calls else [_TOOL_CALLS + text]


def _mistral_calls(text: str) -> list[ToolCall] | str:
    """The calls after `[TOOL_CALLS]`, or why they are not calls."""
    text = text.strip()
    if text.startswith("["):
        try:
            value = json.loads(text)
        except ValueError as e:
            return f"not a JSON list ({e})"
        if not isinstance(value, list) or not value:
            return "an empty list"
        calls = []
        for k, entry in enumerate(value, 1):
            if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
                return f"call {k}: not an object with a name"
            arguments = entry.get("arguments", {})
            if isinstance(arguments, str):
                try:
                    arguments = json.loads(arguments)
                except ValueError:
                    return f"call {k}: arguments are a string that is not JSON"
            if not isinstance(arguments, dict):
                return f"call {k}: arguments are not an object"
            calls.append(_call(entry["name"], arguments, _mistral_id()))
        return calls
    calls = []
    decoder = json.JSONDecoder()
    for k, part in enumerate((p for p in text.split(_TOOL_CALLS) if p.strip()), 1):
        name, found, rest = part.partition(_ARGS)
        if not found or not name.strip():
            return f"call {k}: not NAME[ARGS]{{...}}"
        try:
            arguments, end = decoder.raw_decode(rest.strip())
        except ValueError as e:
            return f"call {k}: arguments not JSON ({e})"
        if not isinstance(arguments, dict):
            return f"call {k}: arguments are not an object"
        if rest.strip()[end:].strip():
            return f"call {k}: text after its arguments"
        calls.append(_call(name.strip(), arguments, _mistral_id()))
    return calls or "no call after [TOOL_CALLS]"


def _mistral(tools: list[dict[str, Any]], stream: bool) -> ToolParser:
    return _Mistral(stream)


TOOL_PARSERS: dict[str, Callable[[list[dict[str, Any]], bool], ToolParser]] = {
    "hermes": _hermes,
    "qwen3_coder": _qwen3_coder,
    "llama3_json": _llama3_json,
    "mistral": _mistral,
}
