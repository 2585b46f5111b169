"""Tool calls streamed as they are written: the name first, then the arguments in fragments.

vLLM's streaming tool parsers send a call as a first delta with its id and name, then pieces of
its arguments string, which the client concatenates. Here a call between an opening and a
closing tag is read by a `CallReader` for its format: once the head (the name) is complete the
call is opened, and from then on every push sends whatever more of the final arguments string
is settled. Fragments are pieces of what the whole call's `arguments` will be (the JSON object
as `json.dumps` writes it), so a client concatenating them gets the same string as a
non-streamed answer.

A block that closes within one push (every block of a whole answer) is read whole, as
`engine.tools.ToolCallStream` reads it: a call, or its text as content when malformed. A call
that turns out malformed after its name went out cannot be taken back: it ends with the
arguments sent so far, as vLLM's streaming parsers leave it (the Responses and Messages dialects
hold calls until the answer ends and check them; proxy/blocks.py).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Protocol

from rolltap.engine.tools import ToolCall, partial_suffix


@dataclass(frozen=True)
class CallPart:
    """A piece of a tool call: a new call when it has an id (and its name), else more of the
    arguments of the call opened last."""

    arguments: str
    id: str | None = None
    name: str | None = None

    @classmethod
    def whole(cls, call: ToolCall) -> CallPart:
        return cls(call.arguments, call.id, call.name)


Piece = str | CallPart


class CallReader(Protocol):
    """One format's call block, read as it grows and once it is whole."""

    def head(self, body: str) -> tuple[str, str] | None:
        """(name, settled prefix of the arguments string) of an unfinished block, or None while
        the name is not yet known; the prefix is "" until some of it is settled."""
        ...

    def parse(self, body: str) -> ToolCall | None:
        """The whole block as a call, or None when it is malformed."""
        ...


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class _Open:
    sent: str = ""
    """The arguments sent so far."""
    broken: bool = False
    """Its arguments stopped being a prefix of anything well formed: nothing more is sent."""


class StreamedCalls:
    """Content and calls, in order, from text pushed piece by piece; calls in `open_tag` ...
    `close_tag` blocks, read by `reader`."""

    def __init__(self, open_tag: str, close_tag: str, reader: CallReader) -> None:
        self._open_tag, self._close_tag, self._reader = open_tag, close_tag, reader
        self._buffer = ""
        self._inside = False
        self._streaming: _Open | None = None

    def push(self, text: str) -> list[Piece]:
        self._buffer += text
        pieces: list[Piece] = []
        while True:
            if self._inside:
                end = self._buffer.find(self._close_tag)
                if end < 0:
                    pieces += self._grow(self._buffer)
                    return pieces
                pieces += self._close(self._buffer[:end], closed=True)
                self._buffer = self._buffer[end + len(self._close_tag) :]
                self._inside = False
            else:
                start = self._buffer.find(self._open_tag)
                if start < 0:
                    # Hold back a tail that could still become the opening tag.
                    cut = len(self._buffer) - partial_suffix(self._buffer, self._open_tag)
                    if cut:
                        pieces.append(self._buffer[:cut])
                    self._buffer = self._buffer[cut:]
                    return pieces
                if start:
                    pieces.append(self._buffer[:start])
                self._buffer = self._buffer[start + len(self._open_tag) :]
                self._inside = True

    def finish(self) -> list[Piece]:
        """End of output: an unclosed final block is still a call when it is complete."""
        pieces: list[Piece] = []
        if self._inside:
            pieces += self._close(self._buffer, closed=False)
        elif self._buffer:
            pieces.append(self._buffer)
        self._buffer, self._inside = "", False
        return pieces

    def _grow(self, body: str) -> list[Piece]:
        """An unfinished block: open its call once the name is known, then send what more of
        its arguments is settled."""
        # A tail that may be the start of the closing tag is not part of the call.
        body = body[: len(body) - partial_suffix(body, self._close_tag)]
        head = self._reader.head(body.strip())
        if head is None:
            return []
        name, settled = head
        pieces: list[Piece] = []
        if self._streaming is None:
            self._streaming = _Open()
            pieces.append(CallPart("", new_call_id(), name))
        pieces += self._more(settled)
        return pieces

    def _more(self, settled: str) -> list[Piece]:
        streaming = self._streaming
        assert streaming is not None
        if streaming.broken or len(settled) <= len(streaming.sent):
            return []
        if not settled.startswith(streaming.sent):
            streaming.broken = True
            return []
        fragment, streaming.sent = settled[len(streaming.sent) :], settled
        return [CallPart(fragment)]

    def _close(self, body: str, *, closed: bool) -> list[Piece]:
        call = self._reader.parse(body.strip())
        streaming, self._streaming = self._streaming, None
        if streaming is None:
            if call is not None:
                return [CallPart.whole(call)]
            return [self._open_tag + body + (self._close_tag if closed else "")]
        if call is None:
            return []  # already a call: it ends with what was sent
        self._streaming = streaming
        pieces = self._more(call.arguments)
        self._streaming = None
        return pieces


# -- settled prefixes of JSON objects ------------------------------------------------------------

_CLOSERS = {"{": "}", "[": "]"}


def settled_json(text: str) -> str | None:
    """The longest prefix of `json.dumps(value, ensure_ascii=False)` that `text`, the start of
    a JSON object's text, already decides; None when `text` cannot start a JSON object.

    The text is cut at its last point where what follows cannot change what precedes (inside a
    string value, or just after a whole value or an opening bracket), completed with the quote
    and brackets it leaves open, read, and written back: minus the completion, that is settled.
    A number, literal or key still being written is left for later."""
    text = text.lstrip()
    if not text.startswith("{"):
        return None if text else ""
    cut = _cut(text)
    if cut is None:
        return None
    end, completion = cut
    try:
        value = json.loads(text[:end] + completion)
    except ValueError:
        return None
    written = json.dumps(value, ensure_ascii=False)
    return written[: len(written) - len(completion)]


def _cut(text: str) -> tuple[int, str] | None:
    """(end, completion): the last point of `text` to cut at, and what closes it there."""
    stack: list[str] = []
    best: tuple[int, str] | None = None
    in_string = is_key = in_scalar = False
    expect_key = False
    escape = 0  # characters left of an escape sequence being read
    high_surrogate = False

    def closing() -> str:
        return "".join(_CLOSERS[c] for c in reversed(stack))

    for i, ch in enumerate(text):
        if in_string:
            if escape:
                code = ""
                if escape == 5:  # the character after the backslash
                    escape = 4 if ch == "u" else 0
                else:
                    escape -= 1
                    code = text[i - 3 : i + 1] if escape == 0 else ""
                if escape == 0 and not is_key:
                    # A high surrogate waits for its pair: the pair is written as one character.
                    high_surrogate = code[:2].lower() in ("d8", "d9", "da", "db")
                    if not high_surrogate:
                        best = (i + 1, '"' + closing())
                continue
            if ch == "\\":
                escape = 5
                continue
            if ch == '"':
                in_string = False
                if not is_key:
                    best = (i + 1, closing())
                continue
            if not is_key and not high_surrogate:
                best = (i + 1, '"' + closing())
            high_surrogate = False
            continue
        if in_scalar and (ch in ",}] \t\r\n"):
            in_scalar = False
            best = (i, closing())
        if ch in "{[":
            stack.append(ch)
            expect_key = ch == "{"
            best = (i + 1, closing())
        elif ch in "}]":
            if not stack or _CLOSERS[stack.pop()] != ch:
                return None
            best = (i + 1, closing())
            if not stack:
                return best
            expect_key = False
        elif ch == '"':
            in_string, is_key, high_surrogate = True, expect_key and stack[-1] == "{", False
        elif ch == ":":
            expect_key = False
        elif ch == ",":
            expect_key = stack[-1] == "{"
        elif ch not in " \t\r\n":
            in_scalar = True
    return best
