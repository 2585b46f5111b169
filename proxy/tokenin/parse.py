"""Generated text back into a chat answer: reasoning, content and tool calls.

A token-in route returns text, unparsed; rolltap splits it the way the engine's own parsers
would (named like vLLM's `--reasoning-parser` and `--tool-call-parser`). Reasoning is split off
first, then the content is read for tool calls. Every parser is incremental, and whole answers
go through the same pushes as streams, so both split a text identically. A tool call that does
not parse stays in the content as the text it was, as vLLM leaves it; a streamed call is sent
as it is written (callstream.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from rolltap.engine.reasoning import ReasoningStream
from rolltap.proxy.tokenin.callstream import CallPart
from rolltap.proxy.tokenin.toolparsers import TOOL_PARSERS, ToolParser


class ReasoningParser(Protocol):
    def push(self, text: str) -> tuple[str, str]:
        """(reasoning, content) of the text pushed so far that is settled."""
        ...

    def finish(self) -> tuple[str, str]: ...


class _DeepSeekR1:
    """DeepSeek-R1: the template opens `<think>`, so the output is reasoning up to `</think>`
    (a `<think>` the model writes again is dropped); without `</think>` all of it is."""

    def __init__(self) -> None:
        self._inner = ReasoningStream(prompt_opened=True)
        self._start = ""
        self._started = False

    def push(self, text: str) -> tuple[str, str]:
        if not self._started:
            self._start += text
            head = self._start.lstrip()
            if "<think>".startswith(head):
                return "", ""
            self._started = True
            text = head.removeprefix("<think>")
        return self._inner.push(text)

    def finish(self) -> tuple[str, str]:
        if not self._started:
            self._started = True
            return self._start, ""
        return self._inner.finish()


def _qwen3() -> ReasoningParser:
    """Qwen3: reasoning when the output opens with `<think>`, up to `</think>`."""
    return ReasoningStream(prompt_opened=False)


REASONING_PARSERS = {"qwen3": _qwen3, "deepseek_r1": _DeepSeekR1}


@dataclass(frozen=True)
class CallDelta:
    """Tool call `index` of the answer: opened here when it has an id (and its name), and
    `arguments`, more of its arguments string."""

    index: int
    arguments: str
    id: str | None = None
    name: str | None = None


@dataclass
class Delta:
    reasoning: str = ""
    content: str = ""
    tool_calls: list[CallDelta] = field(default_factory=list)

    def add(self, other: Delta) -> None:
        self.reasoning += other.reasoning
        self.content += other.content
        self.tool_calls += other.tool_calls

    def calls(self) -> list[CallDelta]:
        """The pieces of each call merged, in order: one entry per call index."""
        merged: dict[int, CallDelta] = {}
        for part in self.tool_calls:
            seen = merged.get(part.index)
            if seen is None:
                merged[part.index] = part
            else:
                arguments = seen.arguments + part.arguments
                merged[part.index] = CallDelta(part.index, arguments, seen.id, seen.name)
        return list(merged.values())


class AnswerParser:
    """One answer's text, pushed as it arrives, split into reasoning, content and calls."""

    def __init__(
        self,
        reasoning: str | None,
        tools: str | None,
        tool_specs: list[dict[str, Any]] | None = None,
        *,
        stream: bool = True,
    ) -> None:
        """`tools`: the tool-call parser, or None when the request offers no tools. `stream`:
        the answer is streamed, so calls are sent as they are written; else each is read whole
        (the same calls, but a call that turns out malformed is content)."""
        self._reasoning = None if reasoning is None else REASONING_PARSERS[reasoning]()
        self._tools: ToolParser | None = None
        if tools is not None:
            self._tools = TOOL_PARSERS[tools](tool_specs or [], stream)
        self.calls = 0

    @property
    def tool_parse(self) -> str | None:
        """Whether the answer's tool-call text parsed (engine.tools.parse_outcome), as far as
        it was read; None when tools are not parsed."""
        return None if self._tools is None else self._tools.outcome

    def push(self, text: str) -> Delta:
        if self._reasoning is None:
            return self._content(text, final=False)
        reasoning, content = self._reasoning.push(text)
        out = self._content(content, final=False)
        out.reasoning = reasoning
        return out

    def finish(self) -> Delta:
        out = Delta()
        if self._reasoning is not None:
            reasoning, content = self._reasoning.finish()
            out.reasoning = reasoning
            out.add(self._content(content, final=False))
        out.add(self._content("", final=True))
        return out

    def _content(self, text: str, *, final: bool) -> Delta:
        if self._tools is None:
            return Delta(content=text)
        pieces = self._tools.push(text) if text else []
        if final:
            pieces += self._tools.finish()
        out = Delta()
        for piece in pieces:
            if isinstance(piece, str):
                out.content += piece
                continue
            if piece.id is not None:
                self.calls += 1
            out.tool_calls.append(_numbered(piece, self.calls - 1))
        return out


def _numbered(part: CallPart, index: int) -> CallDelta:
    return CallDelta(index, part.arguments, part.id, part.name)


def parse_whole(
    text: str, reasoning: str | None, tools: str | None, tool_specs: list[dict[str, Any]] | None
) -> Delta:
    parser = AnswerParser(reasoning, tools, tool_specs, stream=False)
    out = parser.push(text)
    out.add(parser.finish())
    return out
