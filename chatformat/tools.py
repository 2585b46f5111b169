"""Hermes-style tool calls: the prompt text that offers tools, and `<tool_call>` blocks parsed back.

Used when the chat template has no tool support of its own (SmolLM2's has none): tools are listed
in the system prompt inside <tools></tools>, the model answers with
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks, which become OpenAI
`tool_calls`. The parser is incremental so streaming and non-streaming split text identically:
a block that is not valid JSON with a `name` stays in the content, verbatim.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

OPEN = "<tool_call>"
CLOSE = "</tool_call>"

_SYSTEM_BLOCK = """# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{tools}
</tools>

For each function call, return a json object with function name and arguments within \
<tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str
    """A JSON object as a string, as OpenAI sends `function.arguments`."""

    def to_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


def tools_system_block(tools: list[dict[str, Any]]) -> str:
    lines = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
    return _SYSTEM_BLOCK.format(tools=lines)


def render_tool_call(name: str, arguments: object) -> str:
    """The text an assistant turn holds for one call; `arguments` a dict or a JSON string."""
    if isinstance(arguments, str):
        with contextlib.suppress(json.JSONDecodeError):
            arguments = json.loads(arguments)
    payload = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"{OPEN}\n{payload}\n{CLOSE}"


NULL_ARGUMENTS = "null"
"""Arguments written as `null` are read as no arguments, `{}`, by every parser, whole and
streamed alike (callstream.JsonEcho): the model called the tool with nothing to pass, as a
call without `arguments` does; OpenAI's `arguments` is a JSON object, and vLLM's mistral parser
reads `null` as `{}` too (its others pass the text `null` on, which no client reads as an
object)."""

OK = "ok"
NONE = "none"
MALFORMED = "malformed"
REASON_LIMIT = 160
"""A malformed call's reason is cut to this many characters (it is stored with the call)."""


def parse_outcome(calls: int, malformed: str | None) -> str:
    """An answer's tool-call outcome: `ok` (every call it wrote parsed), `malformed: <reason>`
    (the first that did not, and why), `none` (it wrote none). A reason names the broken call
    `tool call N`, N counting the answer's calls: `call N` is what `rolltap show` names the
    rollout's Nth LLM call, which the reason is shown beside."""
    if malformed is not None:
        return f"{MALFORMED}: {malformed[:REASON_LIMIT]}"
    return OK if calls else NONE


def parse_block(body: str) -> ToolCall | None:
    """One block's inside → a ToolCall, or None when it is not a well-formed call."""
    found = read_block(body)
    return found if isinstance(found, ToolCall) else None


def read_block(body: str) -> ToolCall | str:
    """One block's inside → a ToolCall, or why it is not a well-formed call."""
    try:
        call = json.loads(body)
    except json.JSONDecodeError as e:
        return f"not JSON ({e})"
    if not isinstance(call, dict):
        return "not a JSON object"
    if not isinstance(call.get("name"), str):
        return "no name"
    arguments = call.get("arguments", call.get("parameters", {}))
    if arguments is None:
        arguments = {}  # `null`: no arguments (NULL_ARGUMENTS)
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return "arguments are a string that is not JSON"
    if not isinstance(arguments, dict):
        return "arguments are not an object"
    return ToolCall(
        id=f"call_{uuid.uuid4().hex[:24]}",
        name=call["name"],
        arguments=json.dumps(arguments, ensure_ascii=False),
    )


Piece = str | ToolCall


class ToolCallStream:
    """Splits text arriving in pieces into content strings and ToolCalls, in order: calls are
    blocks between `open` and `close` tags whose inside `parse` reads (hermes by default;
    the proxy's token-in parsers give other formats their own)."""

    def __init__(
        self,
        open_tag: str = OPEN,
        close_tag: str = CLOSE,
        parse: Callable[[str], ToolCall | str] = read_block,
    ) -> None:
        self._buffer = ""
        self._inside = False
        self._open, self._close, self._parse = open_tag, close_tag, parse
        self.calls = 0
        self.malformed: str | None = None
        """Why the first block that is no call is not one (None: every block was a call)."""

    @property
    def outcome(self) -> str:
        """`parse_outcome` of the blocks read so far."""
        return parse_outcome(self.calls, self.malformed)

    def push(self, text: str) -> list[Piece]:
        self._buffer += text
        pieces: list[Piece] = []
        while True:
            if self._inside:
                end = self._buffer.find(self._close)
                if end < 0:
                    return pieces
                pieces.append(self._block(self._buffer[:end], closed=True))
                self._buffer = self._buffer[end + len(self._close) :]
                self._inside = False
            else:
                start = self._buffer.find(self._open)
                if start < 0:
                    # Hold back a tail that could still become the opening tag.
                    keep = partial_suffix(self._buffer, self._open)
                    cut = len(self._buffer) - keep
                    _append_text(pieces, self._buffer[:cut])
                    self._buffer = self._buffer[cut:]
                    return pieces
                _append_text(pieces, self._buffer[:start])
                self._buffer = self._buffer[start + len(self._open) :]
                self._inside = True

    def finish(self) -> list[Piece]:
        """End of output: an unclosed final block is still a call when its JSON is complete."""
        pieces: list[Piece] = []
        if self._inside:
            pieces.append(self._block(self._buffer, closed=False))
        else:
            _append_text(pieces, self._buffer)
        self._buffer, self._inside = "", False
        return pieces

    def _block(self, body: str, closed: bool) -> Piece:
        call = self._parse(body.strip())
        if isinstance(call, ToolCall):
            self.calls += 1
            return call
        if self.malformed is None:
            cut = "" if closed else f"cut before {self._close}: "
            self.malformed = f"tool call {self.calls + 1}: {cut}{call}"
        return self._open + body + (self._close if closed else "")


def parse_tool_calls(text: str) -> tuple[str | None, list[ToolCall]]:
    """Whole output → (content or None, calls); the same split a stream makes."""
    stream = ToolCallStream()
    pieces = stream.push(text) + stream.finish()
    calls = [p for p in pieces if isinstance(p, ToolCall)]
    content = "".join(p for p in pieces if isinstance(p, str))
    if calls and not content.strip():
        return None, calls
    return content or None, calls


def _append_text(pieces: list[Piece], text: str) -> None:
    if text:
        pieces.append(text)


def partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for size in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0
