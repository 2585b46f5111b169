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
from typing import Any

from . import harmony
from .callstream import CallPart
from .harmony import HarmonyAnswer, HarmonyDelta
from .reasoners import REASONING_PARSERS, ReasoningParser, Thinking, thinking_of
from .toolparsers import TOOL_PARSERS, ToolParser

__all__ = [
    "REASONING_PARSER_NAMES",
    "TOOL_PARSER_NAMES",
    "AnswerParser",
    "CallDelta",
    "Delta",
    "ReasoningParser",
    "Thinking",
    "parse_whole",
    "thinking_of",
]


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
        thinking: Thinking | bool | None = None,
    ) -> None:
        """`tools`: the tool-call parser, or None when the request offers no tools. `stream`:
        the answer is streamed, so calls are sent as they are written; else each is read whole
        (the same calls, but a call that turns out malformed is content). `thinking`: what
        the request's template arguments say of thinking (`thinking_of`; a bool: both keys say
        so; None: nothing)."""
        self._harmony: HarmonyAnswer | None = None
        self._reasoning: ReasoningParser | None = None
        self._tools: ToolParser | None = None
        if (tools, reasoning) != (None, None) and (
            tools in (harmony.TOOL_PARSER, None) and reasoning in (harmony.REASONING_PARSER, None)
        ):
            self._harmony = HarmonyAnswer(
                reasoning=reasoning is not None, tools=tools is not None, stream=stream
            )
        if self._harmony is None:
            self._reasoning = (
                None if reasoning is None else REASONING_PARSERS[reasoning](Thinking.of(thinking))
            )
            if tools is not None:
                self._tools = TOOL_PARSERS[tools](tool_specs or [], stream)
        self._parses_tools = tools is not None
        self.calls = 0
        self._space = ""
        """Spaces held back before anything else (parsers without `space_before_calls`)."""
        self._spoke = False
        """Content other than spaces went out."""

    @property
    def tool_parse(self) -> str | None:
        """Whether the answer's tool-call text parsed (engine.tools.parse_outcome), as far as
        it was read; None when tools are not parsed."""
        if self._harmony is not None:
            return self._harmony.outcome if self._parses_tools else None
        return None if self._tools is None else self._tools.outcome

    def settle(self, whole: Delta) -> Delta:
        """A whole answer's content beside its calls as vLLM's chat route leaves it: only
        spaces is none, and some parsers strip it (`strip_content`)."""
        if whole.tool_calls and self._tools is not None:
            if getattr(self._tools, "strip_content", False):
                whole.content = whole.content.strip()
            elif not whole.content.strip():
                whole.content = ""
        return whole

    def push(self, text: str, ids: list[int] | None = None) -> Delta:
        """More of the answer: its text, and its token ids (gpt-oss answers are read from
        their ids, harmony.py)."""
        if self._harmony is not None:
            return self._harmony_delta(self._harmony.push(list(ids or ())))
        if self._reasoning is None:
            return self._content(text, final=False)
        reasoning, content = self._reasoning.push(text)
        out = self._content(content, final=False)
        out.reasoning = reasoning
        return out

    def finish(self) -> Delta:
        if self._harmony is not None:
            return self._harmony_delta(self._harmony.finish())
        out = Delta()
        if self._reasoning is not None:
            reasoning, content = self._reasoning.finish()
            out.reasoning = reasoning
            out.add(self._content(content, final=False))
        out.add(self._content("", final=True))
        return out

    def _harmony_delta(self, found: HarmonyDelta) -> Delta:
        out = Delta(reasoning=found.reasoning, content=found.content)
        for part in found.calls or ():
            if part.id is not None:
                self.calls += 1
            out.tool_calls.append(_numbered(part, self.calls - 1))
        return out

    def _content(self, text: str, *, final: bool) -> Delta:
        if self._tools is None:
            return Delta(content=text)
        pieces = self._tools.push(text) if text else []
        if final:
            pieces += self._tools.finish()
        out = Delta()
        hold = not getattr(self._tools, "space_before_calls", True)
        for piece in pieces:
            if isinstance(piece, str):
                if hold and not self.calls and not self._spoke and not piece.strip():
                    self._space += piece  # sent once text follows; dropped if a call does
                    continue
                out.content += self._space + piece
                self._space, self._spoke = "", True
                continue
            if piece.id is not None:
                self.calls += 1
                self._space = ""
            out.tool_calls.append(_numbered(piece, self.calls - 1))
        if final and self._space:
            out.content += self._space
            self._space = ""
        return out


def _numbered(part: CallPart, index: int) -> CallDelta:
    return CallDelta(index, part.arguments, part.id, part.name)


def parse_whole(
    text: str,
    reasoning: str | None,
    tools: str | None,
    tool_specs: list[dict[str, Any]] | None,
    ids: list[int] | None = None,
) -> Delta:
    parser = AnswerParser(reasoning, tools, tool_specs, stream=False)
    out = parser.push(text, ids)
    out.add(parser.finish())
    return parser.settle(out)


TOOL_PARSER_NAMES = sorted([*TOOL_PARSERS, harmony.TOOL_PARSER])
"""Every --tool-call-parser token-in reads (vLLM's names)."""
REASONING_PARSER_NAMES = sorted([*REASONING_PARSERS, harmony.REASONING_PARSER])
"""Every --reasoning-parser token-in reads (vLLM's names)."""
