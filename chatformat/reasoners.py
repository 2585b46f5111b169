"""The token-in reasoning parsers, by vLLM's `--reasoning-parser` names.

Each splits an answer's text, pushed piece by piece, into (reasoning, content) as vLLM's parser
of the same name does. Whether a request thinks is read from its `chat_template_kwargs` key by
key (`Thinking`), since vLLM's parsers do not read the same keys: qwen3 reads only
`enable_thinking`, deepseek_v3 `thinking` or `enable_thinking`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from .reasoning import ReasoningStream
from .tools import OPEN as TOOL_CALL
from .tools import partial_suffix


class ReasoningParser(Protocol):
    def push(self, text: str) -> tuple[str, str]:
        """(reasoning, content) of the text pushed so far that is settled."""
        ...

    def finish(self) -> tuple[str, str]: ...


@dataclass(frozen=True)
class Thinking:
    """What a request's `chat_template_kwargs` say of thinking, key by key: each value as
    Python's truth reads it (vLLM's parsers test `if thinking`), None where the key is absent."""

    enable_thinking: bool | None = None
    thinking: bool | None = None

    @classmethod
    def of(cls, said: Thinking | bool | None) -> Thinking:
        """A caller's `thinking=`: a bool says it under both keys, None says nothing."""
        if isinstance(said, Thinking):
            return said
        return cls() if said is None else cls(said, said)


def thinking_of(template_kwargs: object) -> Thinking:
    """The thinking keys of a request's `chat_template_kwargs` (not a dict: none said)."""
    if not isinstance(template_kwargs, dict):
        return Thinking()
    found = {
        k: bool(template_kwargs[k]) for k in ("enable_thinking", "thinking") if k in template_kwargs
    }
    return Thinking(found.get("enable_thinking"), found.get("thinking"))


_THINK, _END_THINK = "<think>", "</think>"


class _DeepSeekR1:
    """DeepSeek-R1: the template opens `<think>`, so the output is reasoning up to `</think>`
    (a `<think>` the model writes again first is dropped, with the spaces before it); without
    `</think>` all of it is."""

    def __init__(self, thinking: Thinking | None = None) -> None:
        self._inner = ReasoningStream(prompt_opened=True)
        self._start = ""
        self._started = False

    def push(self, text: str) -> tuple[str, str]:
        if not self._started:
            self._start += text
            head = self._start.lstrip()
            if _THINK.startswith(head):
                return "", ""
            self._started = True
            text = head[len(_THINK) :] if head.startswith(_THINK) else self._start
        return self._inner.push(text)

    def finish(self) -> tuple[str, str]:
        if not self._started:
            self._started = True
            return ("" if self._start.strip() == _THINK else self._start), ""
        return self._inner.finish()


class _Qwen3:
    """Qwen3 as vLLM reads it (its `qwen3` parser, vllm/parser/qwen3.py): the output starts
    in reasoning, the template having opened `<think>` (or the model opening it: a `<think>`
    in the reasoning is dropped), up to `</think>` or a `<tool_call>`, which ends reasoning
    and stays in the content (the model called a tool without closing its thought); a
    `</think>` in the content after it is dropped. With `enable_thinking` false (and only that
    key: vLLM's qwen3 reads no other) the answer is all content, verbatim, `</think>` and all."""

    def __init__(self, thinking: Thinking | None = None) -> None:
        # vLLM: `chat_template_kwargs.get("enable_thinking", True)`, tested for truth.
        self._off = (thinking or Thinking()).enable_thinking is False
        self._reasoning = not self._off
        self._held = ""

    def push(self, text: str) -> tuple[str, str]:
        if self._off:
            return "", text
        out: dict[bool, list[str]] = {True: [], False: []}
        window, self._held = self._held + text, ""
        while window:
            tags = (_THINK, _END_THINK, TOOL_CALL) if self._reasoning else (_END_THINK,)
            found = [(window.find(t), t) for t in tags if t in window]
            if not found:
                keep = max(partial_suffix(window, t) for t in tags)
                out[self._reasoning].append(window[: len(window) - keep])
                self._held = window[len(window) - keep :]
                break
            at, tag = min(found)
            out[self._reasoning].append(window[:at])
            if tag == TOOL_CALL:
                self._reasoning = False
                window = window[at:]  # the call is content, read by the tool parser
                continue
            window = window[at + len(tag) :]
            if tag == _END_THINK:
                self._reasoning = False
        return "".join(out[True]), "".join(out[False])

    def finish(self) -> tuple[str, str]:
        held, self._held = self._held, ""
        return (held, "") if self._reasoning else ("", held)


class _NoReasoning:
    def push(self, text: str) -> tuple[str, str]:
        return "", text

    def finish(self) -> tuple[str, str]:
        return "", ""


def _deepseek_v3(thinking: Thinking | None = None) -> ReasoningParser:
    """DeepSeek-V3.1: thinking only when the request's template arguments turn it on
    (`thinking` or `enable_thinking`), then read as DeepSeek-R1; else all content."""
    said = thinking or Thinking()
    return _DeepSeekR1() if (said.thinking or said.enable_thinking) else _NoReasoning()


REASONING_PARSERS: dict[str, Callable[[Thinking], ReasoningParser]] = {
    "qwen3": _Qwen3,
    "deepseek_r1": _DeepSeekR1,
    "deepseek_v3": _deepseek_v3,
}
