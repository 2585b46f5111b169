"""Tool calls streamed as they are written: the name first, then the arguments in fragments.

vLLM's streaming tool parsers send a call as a first delta with its id and name, then pieces of
its arguments string, which the client concatenates. Here a call between an opening and a
closing tag is read by a `CallReader` for its format: once the head (the name) is complete the
call is opened, and from then on every push sends whatever more of the final arguments string
is settled. Fragments are pieces of what the whole call's `arguments` will be (the JSON object
as `json.dumps` writes it), so a client concatenating them gets the same string as a
non-streamed answer. Each character is read once, so a long call costs time linear in its
length (a 10 KB file written through a call is pushed a few characters at a time).

A block that closes within one push (every block of a whole answer) is read whole, as
`engine.tools.ToolCallStream` reads it: a call, or its text as content when malformed. A call
that turns out malformed after its name went out cannot be taken back: it ends with the
arguments sent so far, as vLLM's streaming parsers leave it (the Responses and Messages dialects
hold calls until the answer ends and check them; proxy/dialects/blocks.py).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from .tools import ToolCall, parse_outcome, partial_suffix


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


HEAD_LIMIT = 1024
"""A call whose name is not known within this many characters is not streamed: it is read
whole at its end."""


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class CallReader(Protocol):
    """One block of a format, read as it grows (a reader per block) and once it is whole."""

    def grow(self, text: str) -> tuple[str, str] | None:
        """Read `text`, the block's next characters: None while the call's name is not known,
        then (name, what more of the final arguments string this settled)."""
        ...

    def parse(self, body: str) -> ToolCall | str:
        """The whole block (stripped) as a call, or why it is malformed. A reader may also
        have `ended(body) -> bool`: whether a block the answer's end cut off (unstripped) got
        past its head, where a stripped head cannot tell (glm45's name ends at a newline)."""
        ...


class TagScanner:
    """Finds a tag in text that arrives in pieces, reading each character once."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self._held = ""

    def feed(self, text: str) -> tuple[str, str | None]:
        """(the text before the tag, or all that cannot be its start; what follows the tag, or
        None while it has not been seen)."""
        window = self._held + text
        at = window.find(self.tag)
        if at >= 0:
            self._held = ""
            return window[:at], window[at + len(self.tag) :]
        keep = partial_suffix(window, self.tag)
        cut = len(window) - keep
        self._held = window[cut:]
        return window[:cut], None

    def held(self) -> str:
        """What was kept back as a possible start of the tag."""
        return self._held


@dataclass
class _Block:
    reader: CallReader
    close: TagScanner
    parts: list[str] = field(default_factory=list)
    """The block's text so far."""
    opened: bool = False
    sent: list[str] = field(default_factory=list)
    """The arguments sent so far, in pieces."""


class StreamedCalls:
    """Content and calls, in order, from text pushed piece by piece; calls in `open_tag` ...
    `close_tag` blocks, each read by a reader of its own from `new_reader`."""

    def __init__(
        self,
        open_tag: str,
        close_tag: str,
        new_reader: Callable[[], CallReader],
        *,
        stream: bool = True,
        strip_content: bool = False,
        space_before_calls: bool = True,
    ) -> None:
        """`stream`: send calls as they are written; else each block is read whole once it
        closes (or the answer ends), so a malformed one, even unclosed, is content.
        `strip_content`: a whole answer's content beside its calls is stripped (vLLM's
        engine-based parsers do; AnswerParser.settle). `space_before_calls`: content that is
        only spaces before the first call is sent (false: dropped, as those parsers do)."""
        self._open_tag, self._close_tag, self._new_reader = open_tag, close_tag, new_reader
        self.open_tag = open_tag
        self._stream = stream
        self.strip_content = strip_content
        self.space_before_calls = space_before_calls
        self._called = False
        """A call went out: text outside blocks from here on is not content (vLLM's content is
        what the model wrote before its first call)."""
        self._opening = TagScanner(open_tag)
        self._block: _Block | None = None
        self.calls = 0
        self.malformed: str | None = None
        """Why the first block that is no call is not one."""

    @property
    def outcome(self) -> str:
        return parse_outcome(self.calls, self.malformed)

    def push(self, text: str) -> list[Piece]:
        pieces: list[Piece] = []
        rest: str | None = text
        while rest:
            if self._block is None:
                rest = self._outside(rest, pieces)
            else:
                rest = self._inside(rest, pieces)
        return pieces

    def finish(self) -> list[Piece]:
        """End of output: an unclosed final block is still a call when it is complete."""
        pieces: list[Piece] = []
        block, self._block = self._block, None
        if block is not None:
            pieces += self._close(block, "".join(block.parts) + block.close.held(), closed=False)
        elif self._opening.held() and not self._called:
            pieces.append(self._opening.held())
        self._opening = TagScanner(self._open_tag)
        return pieces

    def _outside(self, text: str, pieces: list[Piece]) -> str | None:
        before, after = self._opening.feed(text)
        if before and not self._called:
            pieces.append(before)
        if after is not None:
            self._block = _Block(self._new_reader(), TagScanner(self._close_tag))
        return after

    def _inside(self, text: str, pieces: list[Piece]) -> str | None:
        block = self._block
        assert block is not None
        before, after = block.close.feed(text)
        block.parts.append(before)
        if after is None:
            if self._stream:
                pieces += self._grow(block, before)
            return None
        self._block = None
        pieces += self._close(block, "".join(block.parts), closed=True)
        return after

    def _grow(self, block: _Block, text: str) -> list[Piece]:
        """An unfinished block: open its call once the name is known, then send what more of
        its arguments is settled. A block that closes in the push that opened it is not
        grown: it is read whole."""
        read = block.reader.grow(text) if text else None
        if read is None:
            return []
        name, more = read
        pieces: list[Piece] = []
        if not block.opened:
            block.opened = True
            pieces.append(CallPart("", new_call_id(), name))
            self._called = True
        if more:
            block.sent.append(more)
            pieces.append(CallPart(more))
        return pieces

    def _close(self, block: _Block, body: str, *, closed: bool) -> list[Piece]:
        found = block.reader.parse(body.strip())
        ended = getattr(block.reader, "ended", None)
        if not closed and isinstance(found, ToolCall) and ended is not None and not ended(body):
            found = "cut before its head ended"
        call = found if isinstance(found, ToolCall) else None
        if call is None:
            self._note(str(found), closed)
        if not block.opened:
            if call is not None:
                self.calls += 1
                self._called = True
                return [CallPart.whole(call)]
            return [self._open_tag + body + (self._close_tag if closed else "")]
        self.calls += call is not None
        sent = "".join(block.sent)
        if call is None or not call.arguments.startswith(sent):
            # Already a call: it ends with what was sent (malformed, or a key given twice,
            # which the whole call's JSON keeps once).
            return []
        rest = call.arguments[len(sent) :]
        return [CallPart(rest)] if rest else []

    def _note(self, why: str, closed: bool) -> None:
        if self.malformed is None:
            cut = "" if closed else f"cut before {self._close_tag}: "
            self.malformed = f"tool call {self.calls + 1}: {cut}{why}"


# -- JSON, re-written as json.dumps writes it, as it arrives -------------------------------------

_RUN = re.compile(r'[^"\\\x00-\x1f]+')
_SPACE = frozenset(" \t\r\n")
_SCALAR_END = frozenset(",}] \t\r\n")
_SHORT_ESCAPES = {
    '"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t",
}  # fmt: skip
_CLOSER = {"{": "}", "[": "]"}


def _written(char: str) -> str:
    """One character inside a string as json.dumps(..., ensure_ascii=False) writes it."""
    return json.dumps(char, ensure_ascii=False)[1:-1]


class JsonEcho:
    """A JSON value's text, fed in pieces, written back as `json.dumps(json.loads(text),
    ensure_ascii=False)` writes it, as far as it is settled: strings character by character,
    numbers and literals once they end, separators as `, ` and `: `. `broken` once the text
    cannot be JSON; `done` once the value is complete (what follows is not read)."""

    def __init__(self, *, object_only: bool = False) -> None:
        """`object_only`: anything but an object is `broken` at its first character, but for
        `null`, written as `{}` (no arguments, tools.NULL_ARGUMENTS) once it ends."""
        self._object_only = object_only
        self._stack: list[str] = []
        self._expect = "value"
        """value | value_or_end | key | key_or_end | colon | next (a comma or the closer)"""
        self._string = False
        self._is_key = False
        self._escape = ""
        self._high = ""
        """A high surrogate read from an escape, waiting for its pair."""
        self._scalar = ""
        self.done = False
        self.broken = False
        self.rest = ""
        """Once `done`: the text fed after the value, unread."""

    def feed(self, text: str) -> str:
        out: list[str] = []
        i, n = 0, len(text)
        while i < n and not (self.done or self.broken):
            if self._string:
                i = self._in_string(text, i, out)
                continue
            ch = text[i]
            if self._scalar:
                if ch not in _SCALAR_END:
                    self._scalar += ch
                    i += 1
                    continue
                if not self._end_scalar(out) or self.done:
                    break  # done: what ended the value is not part of it (`rest`)
            i += 1
            if ch not in _SPACE:
                self._structure(ch, out)
        if self.done:
            self.rest = text[i:]
        return "".join(out)

    def _structure(self, ch: str, out: list[str]) -> None:
        expect = self._expect
        if self._object_only and not self._stack and ch == "n" and expect == "value":
            self._scalar = ch  # only `null` is taken (_end_scalar)
        elif self._object_only and not self._stack and ch != "{":
            self.broken = True
        elif expect in ("value", "value_or_end"):
            if ch in "{[":
                self._stack.append(ch)
                out.append(ch)
                self._expect = "key_or_end" if ch == "{" else "value_or_end"
            elif ch == '"':
                self._string, self._is_key = True, False
                out.append('"')
            elif ch == "]" and expect == "value_or_end":
                self._close(ch, out)
            elif ch == "-" or ch.isalnum():
                self._scalar = ch
            else:
                self.broken = True
        elif expect in ("key", "key_or_end"):
            if ch == '"':
                self._string, self._is_key = True, True
                out.append('"')
            elif ch == "}" and expect == "key_or_end":
                self._close(ch, out)
            else:
                self.broken = True
        elif expect == "colon":
            if ch == ":":
                out.append(": ")
                self._expect = "value"
            else:
                self.broken = True
        elif ch == ",":
            out.append(", ")
            self._expect = "key" if self._stack[-1] == "{" else "value"
        elif ch in "}]":
            self._close(ch, out)
        else:
            self.broken = True

    def _close(self, ch: str, out: list[str]) -> None:
        if not self._stack or _CLOSER[self._stack[-1]] != ch:
            self.broken = True
            return
        self._stack.pop()
        out.append(ch)
        self._after_value()

    def _after_value(self) -> None:
        if self._stack:
            self._expect = "next"
        else:
            self.done = True

    def _end_scalar(self, out: list[str]) -> bool:
        """Write the number or literal just ended; False when it is none (then `broken`)."""
        token, self._scalar = self._scalar, ""
        try:
            value = json.loads(token)
        except ValueError:
            self.broken = True
            return False
        if self._object_only and not self._stack:
            if value is not None:
                self.broken = True
                return False
            out.append("{}")
            self.done = True
            return True
        out.append(json.dumps(value))
        self._after_value()
        return True

    def _in_string(self, text: str, i: int, out: list[str]) -> int:
        ch = text[i]
        if self._escape:
            self._escape += ch
            escape = self._escape
            if escape[1] == "u":
                if len(escape) < 6:
                    return i + 1
                try:
                    char = chr(int(escape[2:], 16))
                except ValueError:
                    self.broken = True
                    return i + 1
            elif escape[1] in _SHORT_ESCAPES:
                char = _SHORT_ESCAPES[escape[1]]
            else:
                self.broken = True
                return i + 1
            self._escape = ""
            self._char(char, out)
            return i + 1
        if ch == "\\":
            self._escape = "\\"
            return i + 1
        self._flush_high(out)
        if ch == '"':
            self._string = False
            out.append('"')
            if self._is_key:
                self._expect = "colon"
            else:
                self._after_value()
            return i + 1
        run = _RUN.match(text, i)
        if run is None:  # a raw control character: strict JSON (and json.loads) refuses it
            self.broken = True
            return i + 1
        out.append(run.group())
        return run.end()

    def _char(self, char: str, out: list[str]) -> None:
        """A character read from an escape; a surrogate pair is written as one character."""
        if self._high:
            if "\udc00" <= char <= "\udfff":
                pair = (self._high + char).encode("utf-16", "surrogatepass").decode("utf-16")
                self._high = ""
                out.append(_written(pair))
                return
            self._flush_high(out)
        if "\ud800" <= char <= "\udbff":
            self._high = char
            return
        out.append(_written(char))

    def _flush_high(self, out: list[str]) -> None:
        if self._high:
            out.append(_written(self._high))
            self._high = ""


# -- calls written one after another, with no tags around them -----------------------------------


class CallSequence:
    """Calls written back to back as `HEAD{arguments}CLOSER`, separated by one of
    `separators`, optionally inside `opening` ... `ending` (llama3_json: JSON objects joined by
    `;`; mistral: a JSON list, or `NAME[ARGS]{...}` joined by `[TOOL_CALLS]`), streamed as the
    tagged blocks are: each call opens at its name, its arguments follow as settled. Where the
    text stops being such a sequence nothing more is sent; `settle` reconciles with the calls
    the whole text turns out to hold."""

    def __init__(
        self,
        head: re.Pattern[str],
        *,
        json_name: bool,
        closer: str,
        separators: tuple[str, ...],
        opening: str = "",
        ending: str = "",
        new_id: Callable[[], str] = new_call_id,
    ) -> None:
        """`head`: matches what precedes the arguments, its group 1 the name (a JSON string's
        inside when `json_name`)."""
        self._head, self._json_name, self._closer = head, json_name, closer
        self._separators, self._opening, self._ending = separators, opening, ending
        self._new_id = new_id
        self._state = "opening" if opening else "between"
        self._buffer = ""
        self._arguments = JsonEcho(object_only=True)
        self._sent: list[list[str]] = []
        """The arguments sent of each call opened, in pieces."""

    @property
    def opened(self) -> int:
        return len(self._sent)

    def push(self, text: str) -> list[CallPart]:
        out: list[CallPart] = []
        while text and self._state not in ("stuck", "done"):
            if self._state == "args":
                more = self._arguments.feed(text)
                if more:
                    self._sent[-1].append(more)
                    out.append(CallPart(more))
                if self._arguments.broken:
                    self._state = "stuck"
                if not self._arguments.done:
                    break
                text, self._state = self._arguments.rest, "closer" if self._closer else "between"
                continue
            self._buffer += text
            text = ""
            if self._state == "head":
                text = self._read_head(out)
                continue
            rest = self._buffer.lstrip()
            expected = {
                "opening": (self._opening,),
                "closer": (self._closer,),
                "between": self._separators,
            }[self._state]
            found = next((t for t in expected if rest.startswith(t)), None)
            if self._state == "between" and self._ending and rest.startswith(self._ending):
                self._state = "done"
            elif found is not None:
                self._buffer, text = "", rest[len(found) :]
                self._state = "between" if self._state != "between" else "head"
            elif not rest or any(t.startswith(rest) for t in expected):
                self._buffer = rest  # not yet told apart
            elif self._state == "between" and not self.opened:
                self._buffer, text, self._state = "", rest, "head"  # the first call: no separator
            else:
                self._state = "stuck"
        return out

    def _read_head(self, out: list[CallPart]) -> str:
        head = self._buffer.lstrip()
        match = self._head.match(head)
        if match is None:
            if len(head) > HEAD_LIMIT:
                self._state = "stuck"
            return ""
        name = match.group(1)
        if self._json_name:
            try:
                name = json.loads('"' + name + '"')
            except ValueError:
                self._state = "stuck"
                return ""
        self._buffer, self._state = "", "args"
        self._arguments = JsonEcho(object_only=True)
        self._sent.append([])
        out.append(CallPart("", self._new_id(), name.strip()))
        return head[match.end() :]

    def settle(self, calls: list[ToolCall] | None) -> list[CallPart]:
        """What is left to send once the whole text reads as `calls` (None: malformed)."""
        if calls is None:
            return []  # the calls opened end with what was sent
        out: list[CallPart] = []
        for k, call in enumerate(calls):
            if k >= len(self._sent):
                out.append(CallPart(call.arguments, self._new_id(), call.name))
                continue
            # Only the call opened last can still take more: more goes to the latest call.
            sent = "".join(self._sent[k])
            rest = call.arguments[len(sent) :]
            if k == len(self._sent) - 1 and call.arguments.startswith(sent) and rest:
                out.append(CallPart(rest))
        return out
