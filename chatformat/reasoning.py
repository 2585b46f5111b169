"""The `think` reasoning parser: `<think>…</think>` text becomes `reasoning`, the rest `content`.

Reasoning starts when the output opens with `<think>` (after optional whitespace) or when the
prompt already opened it (the template's generation prompt ends in `<think>`); it ends at
`</think>`, or with the output if the model never closes it. Output that does not start in
reasoning is all content. Incremental, so streaming and non-streaming split text identically.
"""

from __future__ import annotations

from .tools import partial_suffix

OPEN = "<think>"
CLOSE = "</think>"


def prompt_opens_reasoning(prompt_text: str) -> bool:
    return prompt_text.rstrip().endswith(OPEN)


class ReasoningStream:
    """Feeds text in, gets (reasoning, content) deltas out."""

    def __init__(self, prompt_opened: bool) -> None:
        self._state = "reasoning" if prompt_opened else "start"
        self._buffer = ""

    def push(self, text: str) -> tuple[str, str]:
        self._buffer += text
        if self._state == "start":
            head = self._buffer.lstrip()
            if head.startswith(OPEN):
                self._state = "reasoning"
                self._buffer = head[len(OPEN) :]
            elif OPEN.startswith(head):
                return "", ""
            else:
                self._state = "content"
        if self._state == "content":
            out, self._buffer = self._buffer, ""
            return "", out
        end = self._buffer.find(CLOSE)
        if end >= 0:
            reasoning, content = self._buffer[:end], self._buffer[end + len(CLOSE) :]
            self._state, self._buffer = "content", ""
            return reasoning, content
        keep = partial_suffix(self._buffer, CLOSE)
        cut = len(self._buffer) - keep
        out, self._buffer = self._buffer[:cut], self._buffer[cut:]
        return out, ""

    def finish(self) -> tuple[str, str]:
        rest, self._buffer = self._buffer, ""
        if self._state == "reasoning":
            return rest, ""
        return "", rest


def split_reasoning(text: str, prompt_opened: bool) -> tuple[str | None, str | None]:
    """Whole output → (reasoning or None, content or None)."""
    stream = ReasoningStream(prompt_opened)
    r1, c1 = stream.push(text)
    r2, c2 = stream.finish()
    return (r1 + r2) or None, (c1 + c2) or None
