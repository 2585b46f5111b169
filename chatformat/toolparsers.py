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
import math
import re
import secrets
import string
from collections.abc import Callable
from typing import Any, Protocol

from .callstream import (
    HEAD_LIMIT,
    CallPart,
    CallSequence,
    JsonEcho,
    Piece,
    StreamedCalls,
    TagScanner,
    new_call_id,
)
from .tools import CLOSE, OPEN, ToolCall, parse_outcome, read_block


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


_TYPE_ORDER = ("null", "integer", "number", "boolean", "object", "array", "string")


def _typed(value: str, schema: Any) -> Any:
    """A parameter's raw text as its schema's type, as vLLM coerces it
    (vllm/tool_parsers/utils.py `coerce_to_schema_type`): the schema's types tried in the
    order null, integer, number, boolean, object, array, string; text no type takes is
    JSON if it is JSON, else text. A parameter the schema does not name stays text."""
    if not isinstance(schema, dict):
        return value
    declared = schema.get("type", "string")
    types = {declared} if isinstance(declared, str) else set(declared)
    if not types:
        types = {"string"}
    for kind in (k for k in _TYPE_ORDER if k in types):
        found = _as_type(value, kind)
        if found is not _NOT:
            return found
    try:
        parsed = json.loads(value)
    except ValueError:
        return value
    return parsed if _finite(parsed) else value


_NOT = object()


def _as_type(value: str, kind: str) -> Any:
    """`value` as `kind`, or _NOT."""
    if kind == "string":
        return value
    if kind == "null":
        return None if value.lower() == "null" else _NOT
    if kind in ("integer", "number"):
        try:
            return int(value)
        except ValueError:
            if kind == "integer":
                return _NOT
        try:
            number = float(value)
        except ValueError:
            return _NOT
        if not math.isfinite(number):
            return _NOT
        return int(number) if number.is_integer() else number
    if kind == "boolean":
        lowered = value.lower().strip()
        return {"true": True, "1": True, "false": False, "0": False}.get(lowered, _NOT)
    try:
        parsed = json.loads(value)
    except ValueError:
        return _NOT
    return parsed if _finite(parsed) else _NOT


def _finite(value: Any) -> bool:
    """No inf or nan anywhere in it (json.dumps would write Infinity, which is no JSON)."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    return True


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
                if (opened and not _tag_name(key)) or _broken_name(key):
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
            if len(rest) > HEAD_LIMIT or _broken_name(name):
                self._state = "stuck"
            return ""
        if not _tag_name(name):
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


def _broken_name(name: str) -> bool:
    """A name in `<function=...>` or `<parameter=...>` that has run into text: the `>` that
    ends it was never written (the call is malformed, not a key with a line break in it)."""
    return "\n" in name.strip() or "<" in name


def _tag_name(name: str) -> bool:
    return bool(name.strip()) and not _broken_name(name)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _qwen3_coder(tools: list[dict[str, Any]], stream: bool) -> ToolParser:
    types = _schema_types(tools)
    return StreamedCalls(
        OPEN,
        CLOSE,
        lambda: _Qwen3CoderReader(types),
        stream=stream,
        strip_content=True,
        space_before_calls=False,
    )


# -- hermes --------------------------------------------------------------------------------------

_JSON_HEAD = re.compile(
    r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*'
)


_HERMES_HEAD = re.compile(r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')
"""Hermes calls need `arguments` (vLLM's parser)."""


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
            match = _HERMES_HEAD.match(head)
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
        return _hermes_block(body)


def _hermes_block(body: str) -> ToolCall | str:
    """A block's inside as vLLM's hermes parser reads it: `arguments` is needed (a KeyError
    there; the built-in engine's reader, chatformat/tools.py, also takes `parameters` or none)."""
    try:
        value = json.loads(body)
    except ValueError:
        return read_block(body)
    if isinstance(value, dict) and isinstance(value.get("name"), str) and "arguments" not in value:
        return "no arguments"
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
    """The calls, or why the text is not calls. As vLLM reads them: each JSON object from a
    `{` after the one before (whatever stands between them or after the last, `;` or text, is
    not read)."""
    decoder = json.JSONDecoder()
    calls: list[ToolCall] = []
    at = text.find("{")
    while at >= 0:
        try:
            value, end = decoder.raw_decode(text, at)
        except ValueError as e:
            return f"tool call {len(calls) + 1}: not JSON ({e})"
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            return f"tool call {len(calls) + 1}: not an object with a name"
        if "arguments" not in value and "parameters" not in value:
            return f"tool call {len(calls) + 1}: no parameters"
        arguments = value["arguments"] if "arguments" in value else value["parameters"]
        if arguments is None:
            arguments = {}  # tools.NULL_ARGUMENTS
        if not isinstance(arguments, dict):
            return f"tool call {len(calls) + 1}: parameters are not an object"
        calls.append(_call(value["name"], arguments))
        at = text.find("{", end)
    return calls or "no call"


def _llama3_json(tools: list[dict[str, Any]], stream: bool) -> ToolParser:
    return _Llama3Json(stream)


# -- mistral -------------------------------------------------------------------------------------

_TOOL_CALLS = "[TOOL_CALLS]"
_ID_CHARS = string.ascii_letters + string.digits


def _mistral_id() -> str:
    """Mistral's tool-call ids: nine letters and digits (its templates refuse others)."""
    return "".join(secrets.choice(_ID_CHARS) for _ in range(9))


_V11_HEAD = re.compile(r"([^\[\]{}]+?)(?:\[ARGS\]|(?=\{))")
"""Mistral's tokenizer v11 and later: `NAME[ARGS]` before each call's arguments, or `NAME`
right before them (vLLM's mistral parser takes `{` for the separator too)."""


class _Mistral:
    """Content up to `[TOOL_CALLS]`; from there to the end, calls read at the end. Streamed
    (`stream`), each also opens at its name and streams its arguments, in either format.

    The two formats are told apart by the text after `[TOOL_CALLS]` (JSON before v11), and
    vLLM reads content beside them differently, as its parser for each tokenizer does: beside
    v11 calls the whole answer's content is stripped and spaces before the first call are not
    sent (its engine-based parser); before v11 both are kept (its legacy one)."""

    def __init__(self, stream: bool) -> None:
        self._content = TagScanner(_TOOL_CALLS)
        self._parts: list[str] | None = None
        """The text after `[TOOL_CALLS]`; None before it."""
        self._stream = stream
        self._sequence: CallSequence | None = None
        self._read: list[ToolCall] | str = []
        self._v11: bool | None = None
        """The calls are v11's `NAME[ARGS]{...}` (None: not known yet)."""
        self._lead = ""
        """Content that is only spaces, held until it is known whether v11 calls follow."""
        self._spoke = False

    @property
    def outcome(self) -> str:
        return _outcome(self._read)

    @property
    def strip_content(self) -> bool:
        return self._v11 is True

    def push(self, text: str) -> list[Piece]:
        if self._parts is not None:
            self._parts.append(text)
            return self._led(self._stream_calls(text), final=False)
        out, rest = self._content.feed(text)
        pieces = self._said(out)
        if rest is not None:
            self._parts = [rest]
            pieces += self._led(self._stream_calls(rest), final=False)
        return pieces

    def _said(self, out: str) -> list[Piece]:
        if not self._spoke and not out.strip():
            self._lead += out
            return []
        out, self._lead, self._spoke = self._lead + out, "", True
        return [out]

    def _led(self, pieces: list[Piece], *, final: bool) -> list[Piece]:
        """`pieces` after the spaces held before them, unless v11 calls open with them."""
        if not self._lead:
            return pieces
        opens = any(isinstance(p, CallPart) and p.id is not None for p in pieces)
        if not (opens or final):
            return pieces
        lead, self._lead = self._lead, ""
        return pieces if opens and self._v11 else [lead, *pieces]

    def _stream_calls(self, text: str) -> list[Piece]:
        if not self._stream:
            return []
        if self._sequence is None:
            begun = "".join(self._parts or ()).lstrip()
            if not begun:
                return []
            self._v11 = not begun.startswith(("[", "{"))
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
            return self._led([text] if text else [], final=True)
        text, self._parts = "".join(self._parts), None
        if text.strip():
            self._v11 = not text.lstrip().startswith(("[", "{"))
        read = self._read = _mistral_calls(text)
        calls = None if isinstance(read, str) else read
        if self._sequence is not None and self._sequence.opened:
            return self._led(list(self._sequence.settle(calls)), final=True)
        pieces: list[Piece] = [CallPart.whole(c) for c in calls] if calls else [_TOOL_CALLS + text]
        return self._led(pieces, final=True)


def _mistral_calls(text: str) -> list[ToolCall] | str:
    """The calls after `[TOOL_CALLS]`, or why they are not calls."""
    text = text.strip()
    if text.startswith(("[", "{")):
        try:
            # As vLLM reads it: the first JSON value, what follows it ignored; a bare
            # object is one call.
            value, _ = json.JSONDecoder().raw_decode(text)
        except ValueError as e:
            return f"not JSON ({e})"
        if isinstance(value, dict):
            value = [value]
        if not isinstance(value, list) or not value:
            return "an empty list"
        calls = []
        for k, entry in enumerate(value, 1):
            if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
                return f"tool call {k}: not an object with a name"
            arguments = entry.get("arguments", {})
            if arguments is None:
                arguments = {}  # tools.NULL_ARGUMENTS
            if isinstance(arguments, str):
                try:
                    arguments = json.loads(arguments)
                except ValueError:
                    return f"tool call {k}: arguments are a string that is not JSON"
            if not isinstance(arguments, dict):
                return f"tool call {k}: arguments are not an object"
            calls.append(_call(entry["name"], arguments, _mistral_id()))
        return calls
    calls = []
    decoder = json.JSONDecoder()
    for k, part in enumerate((p for p in text.split(_TOOL_CALLS) if p.strip()), 1):
        head = _V11_HEAD.match(part.lstrip())
        if head is None or not head.group(1).strip():
            return f"tool call {k}: not NAME[ARGS]{{...}}"
        try:
            # As the stream reads it (and vLLM): the arguments' JSON, what follows it ignored.
            arguments, _ = decoder.raw_decode(part.lstrip()[head.end() :].lstrip())
        except ValueError as e:
            return f"tool call {k}: arguments not JSON ({e})"
        if arguments is None:
            arguments = {}  # tools.NULL_ARGUMENTS
        if not isinstance(arguments, dict):
            return f"tool call {k}: arguments are not an object"
        calls.append(_call(head.group(1).strip(), arguments, _mistral_id()))
    return calls or "no call after [TOOL_CALLS]"


def _mistral(tools: list[dict[str, Any]], stream: bool) -> ToolParser:
    return _Mistral(stream)


# -- glm45 ---------------------------------------------------------------------------------------

_GLM_ARG = re.compile(r"\s*<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)
_GLM_NAME_END = re.compile(r"\n|<arg_key>")


class _GlmReader:
    """`NAME` then `<arg_key>KEY</arg_key><arg_value>VALUE</arg_value>` pairs (GLM-4.5 to 4.7),
    values typed by the tool's schema as qwen3_coder's are. The call opens at its name; its
    arguments go out whole when the block closes."""

    def __init__(self, types: dict[str, dict[str, Any]]) -> None:
        self._types = types
        self._head = ""
        self._name: str | None = None

    def grow(self, text: str) -> tuple[str, str] | None:
        if self._name is None:
            self._head += text
            end = _GLM_NAME_END.search(self._head.lstrip())
            if end is None or not self._head.lstrip()[: end.start()].strip():
                return None
            self._name = self._head.lstrip()[: end.start()].strip()
        return self._name, ""

    def ended(self, body: str) -> bool:
        """Whether an unclosed block (the answer cut at the token limit) got past its name:
        `<tool_call>get_wea` is a name cut short, not a call named `get_wea`."""
        return _GLM_NAME_END.search(body.lstrip()) is not None

    def parse(self, body: str) -> ToolCall | str:
        end = _GLM_NAME_END.search(body)
        name = (body if end is None else body[: end.start()]).strip()
        if not name or "<" in name:
            return "no function name"
        rest = "" if end is None else body[end.start() :]
        found: dict[str, Any] = {}
        at = 0
        for match in _GLM_ARG.finditer(rest):
            if rest[at : match.start()].strip():
                return "text between its arguments"
            key = match.group(1).strip()
            found[key] = _typed(match.group(2), self._types.get(name, {}).get(key))
            at = match.end()
        if rest[at:].strip():
            return "not <arg_key>KEY</arg_key><arg_value>VALUE</arg_value>"
        return _call(name, found)


def _glm45(tools: list[dict[str, Any]], stream: bool) -> ToolParser:
    types = _schema_types(tools)
    return StreamedCalls(
        OPEN,
        CLOSE,
        lambda: _GlmReader(types),
        stream=stream,
        strip_content=True,
        space_before_calls=False,
    )


# -- kimi_k2, deepseek_v31: calls in a section, a header and JSON arguments each -------------------


class _HeaderReader:
    """`HEADER` `separator` `{JSON arguments}`: the call opens once its header is complete
    (`name_of` reads the name from it), then its arguments stream as json.dumps writes them."""

    def __init__(self, separator: str, name_of: Callable[[str], str | None]) -> None:
        self._separator, self._name_of = separator, name_of
        self._head = ""
        self._name: str | None = None
        self._arguments = JsonEcho(object_only=True)

    def grow(self, text: str) -> tuple[str, str] | None:
        if self._name is None:
            self._head += text
            head, found, rest = self._head.partition(self._separator)
            if not found:
                if len(self._head) > HEAD_LIMIT:
                    self._arguments.broken = True
                return None
            name = self._name_of(head)
            if name is None:
                self._arguments.broken = True
                return None
            self._name, text = name, rest
        echo = self._arguments
        return self._name, "" if echo.broken or echo.done else echo.feed(text)

    def parse(self, body: str) -> ToolCall | str:
        head, found, rest = body.partition(self._separator)
        if not found:
            return f"no {self._separator}"
        name = self._name_of(head)
        if name is None:
            return "no function name"
        try:
            arguments = json.loads(rest)
        except ValueError as e:
            return f"arguments not JSON ({e})"
        if arguments is None:
            arguments = {}  # tools.NULL_ARGUMENTS
        if not isinstance(arguments, dict):
            return "arguments are not an object"
        return _call(name, arguments)


class _Section:
    """Content up to `open_tag`; from there, calls (`calls`) in a section that `close_tag`
    ends: what stands between the calls is not content (a malformed call is, verbatim)."""

    def __init__(self, open_tag: str, close_tag: str, calls: StreamedCalls) -> None:
        self._open_tag, self._close_tag = open_tag, close_tag
        self._content = TagScanner(open_tag)
        self._inside = False
        self._calls = calls
        self.strip_content = calls.strip_content
        self.space_before_calls = calls.space_before_calls

    @property
    def outcome(self) -> str:
        return self._calls.outcome

    def push(self, text: str) -> list[Piece]:
        pieces: list[Piece] = []
        if not self._inside:
            before, after = self._content.feed(text)
            if before:
                pieces.append(before)
            if after is None:
                return pieces
            self._inside, text = True, after
        return pieces + self._kept(self._calls.push(text))

    def finish(self) -> list[Piece]:
        if not self._inside:
            held = self._content.held()
            return [held] if held else []
        return self._kept(self._calls.finish())

    def _kept(self, pieces: list[Piece]) -> list[Piece]:
        out: list[Piece] = []
        for piece in pieces:
            if not isinstance(piece, str):
                out.append(piece)
            elif piece.startswith(self._calls.open_tag):  # a malformed call, verbatim
                out.append(piece if self._calls.calls else self._open_tag + piece)
        return out


_KIMI_HEADER = re.compile(r"\s*(?:functions\.)?([^:\s]+):\d+\s*")


def _kimi_name(header: str) -> str | None:
    """`functions.NAME:INDEX` (Kimi's own call id) -> NAME."""
    match = _KIMI_HEADER.fullmatch(header)
    return None if match is None else match.group(1)


def _kimi_k2(tools: list[dict[str, Any]], stream: bool) -> ToolParser:
    calls = StreamedCalls(
        "<|tool_call_begin|>",
        "<|tool_call_end|>",
        lambda: _HeaderReader("<|tool_call_argument_begin|>", _kimi_name),
        stream=stream,
        space_before_calls=False,
    )
    return _Section("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", calls)


def _v31_name(header: str) -> str | None:
    return header.strip() or None


def _deepseek_v31(tools: list[dict[str, Any]], stream: bool) -> ToolParser:
    calls = StreamedCalls(
        "<｜tool▁call▁begin｜>",
        "<｜tool▁call▁end｜>",
        lambda: _HeaderReader("<｜tool▁sep｜>", _v31_name),
        stream=stream,
    )
    return _Section("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", calls)


TOOL_PARSERS: dict[str, Callable[[list[dict[str, Any]], bool], ToolParser]] = {
    "hermes": _hermes,
    "qwen3_coder": _qwen3_coder,
    # vLLM reads Qwen3.5/3.6's XML calls with the same parser under this name.
    "qwen3_xml": _qwen3_coder,
    "llama3_json": _llama3_json,
    "mistral": _mistral,
    "glm45": _glm45,
    "kimi_k2": _kimi_k2,
    "deepseek_v31": _deepseek_v31,
}
