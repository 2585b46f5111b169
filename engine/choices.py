"""One choice's output as tokens arrive: ids, logprobs, and text split into reasoning/content/calls.

Streaming and non-streaming responses both feed every TokenEvent through a choice, so the
two always split text the same way; the ids are recorded untouched by any parsing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..chatformat.reasoning import ReasoningStream
from ..chatformat.tools import ToolCall, ToolCallStream
from .generation import Aborted, RowEvent, TokenEvent

# vLLM clamps chat logprobs here so -inf (a token top-k/top-p removed) stays valid JSON.
LOGPROB_FLOOR = -9999.0

TokenText = Callable[[int], str]


@dataclass
class ChatDelta:
    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.tool_calls)


class ChoiceOutput:
    """Ids, logprob entries and text of one choice; subclasses split the text further."""

    def __init__(self, index: int, token_text: TokenText, logprobs: bool, as_ids: bool) -> None:
        self.index = index
        self.token_ids: list[int] = []
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self.text = ""
        self._token_text = token_text
        self._logprobs = logprobs
        self._as_ids = as_ids
        self.events: list[TokenEvent] = []
        self._versions: list[tuple[str | None, int, int]] = []

    def record(self, event: RowEvent) -> None:
        self.text += event.text
        if isinstance(event, Aborted):
            self.finish_reason, self.stop_reason = "abort", None
            return
        self._note_version(event.weight_version)
        self.token_ids.append(event.token_id)
        if self._logprobs:
            self.events.append(event)
        if event.finish_reason is not None:
            self.finish_reason = event.finish_reason
            self.stop_reason = event.stop_reason

    def _note_version(self, version: str | None) -> None:
        n = len(self.token_ids)
        if self._versions and self._versions[-1][0] == version:
            label, start, _ = self._versions[-1]
            self._versions[-1] = (label, start, n + 1)
        else:
            self._versions.append((version, n, n + 1))

    def weight_versions(self) -> list[dict[str, Any]]:
        """vLLM's `weight_versions`: one {version, start, end} span per label over the output."""
        return [{"version": v, "start": a, "end": b} for v, a, b in self._versions]

    def _token(self, token_id: int) -> str:
        return f"token_id:{token_id}" if self._as_ids else self._token_text(token_id)

    def chat_logprobs(self, events: list[TokenEvent]) -> dict[str, Any] | None:
        """vLLM's chat `logprobs`: {"content": [{token, logprob, bytes, top_logprobs}, ...]}."""
        if not self._logprobs:
            return None
        return {"content": [self._chat_entry(e) for e in events]}

    def _chat_entry(self, event: TokenEvent) -> dict[str, Any]:
        entry = self._entry(event.token_id, event.logprob)
        entry["top_logprobs"] = [self._entry(t, lp) for t, lp in event.top]
        return entry

    def _entry(self, token_id: int, logprob: float) -> dict[str, Any]:
        text = self._token_text(token_id)
        return {
            "token": self._token(token_id),
            "logprob": max(logprob, LOGPROB_FLOOR),
            "bytes": list(text.encode("utf-8", errors="replace")),
        }

    def completion_logprobs(self, events: list[TokenEvent], offset: int) -> dict[str, Any] | None:
        """The legacy completions shape: parallel lists tokens/token_logprobs/top_logprobs."""
        if not self._logprobs:
            return None
        tokens, values, tops, offsets = [], [], [], []
        for event in events:
            tokens.append(self._token(event.token_id))
            values.append(max(event.logprob, LOGPROB_FLOOR))
            top = {self._token(t): max(lp, LOGPROB_FLOOR) for t, lp in event.top}
            top.setdefault(tokens[-1], values[-1])
            tops.append(top)
            offsets.append(offset)
            offset += len(self._token_text(event.token_id))
        return {
            "text_offset": offsets,
            "token_logprobs": values,
            "tokens": tokens,
            "top_logprobs": tops,
        }


class ChatChoice(ChoiceOutput):
    """A chat choice: text goes through the reasoning parser, then the tool-call parser."""

    def __init__(
        self,
        index: int,
        token_text: TokenText,
        *,
        logprobs: bool,
        as_ids: bool,
        reasoning: ReasoningStream | None,
        tools: ToolCallStream | None,
    ) -> None:
        super().__init__(index, token_text, logprobs, as_ids)
        self._reasoning = reasoning
        self._tools = tools
        self.message = ChatDelta()

    def feed(self, event: RowEvent) -> ChatDelta:
        """Record the event; return what it adds to the message."""
        self.record(event)
        delta = ChatDelta()
        self._split(event.text, delta, final=False)
        if self.finish_reason is not None:
            self._split("", delta, final=True)
            if self.message.tool_calls and self.finish_reason == "stop":
                self.finish_reason = "tool_calls"
        self.message.reasoning += delta.reasoning
        self.message.content += delta.content
        self.message.tool_calls += delta.tool_calls
        return delta

    def _split(self, text: str, delta: ChatDelta, final: bool) -> None:
        reasoning, content = "", text
        if self._reasoning is not None:
            if final:
                reasoning, content = self._reasoning.finish()
            else:
                reasoning, content = self._reasoning.push(text)
        delta.reasoning += reasoning
        if self._tools is None:
            delta.content += content
            return
        pieces = self._tools.push(content)
        if final:
            pieces += self._tools.finish()
        for piece in pieces:
            if isinstance(piece, ToolCall):
                delta.tool_calls.append(piece)
            else:
                delta.content += piece

    @property
    def tool_parse(self) -> str | None:
        """Whether the tool-call text of the answer so far parsed (engine.tools.parse_outcome);
        None when tools are not parsed. Sent beside `finish_reason`, as `tool_parse`, for the
        proxy to record (vLLM sends none)."""
        return None if self._tools is None else self._tools.outcome

    def final_message(self) -> dict[str, Any]:
        message = self.message
        blank = not message.content.strip()
        content = None if blank and (message.tool_calls or message.reasoning) else message.content
        return {
            "role": "assistant",
            "content": content,
            "reasoning": message.reasoning or None,
            "tool_calls": [c.to_openai() for c in message.tool_calls],
        }
