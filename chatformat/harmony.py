"""gpt-oss answers (OpenAI's Harmony format) read from their token ids with `openai-harmony`.

gpt-oss writes messages, not marked-up text: `<|channel|>analysis<|message|>...<|end|>` is
reasoning, the `final` channel (or `commentary` with no recipient) is content, and a message to
`functions.NAME` is a tool call whose text is its arguments. Its markers are special tokens that
a completions route's text drops, so the answer is read from its ids, by OpenAI's own parser
(`openai_harmony.StreamableParser` on the `HARMONY_GPT_OSS` encoding, as vLLM's `openai` tool
parser and `openai_gptoss` reasoning parser read it); that library is an optional dependency
(`pip install 'rolltap[harmony]'`). Its encoding loads the o200k vocabulary (downloaded once;
offline: `TIKTOKEN_ENCODINGS_BASE=DIR` holding `o200k_base.tiktoken`).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

from .callstream import CallPart, new_call_id
from .tools import parse_outcome

TOOL_PARSER = "openai"
REASONING_PARSER = "openai_gptoss"
_FUNCTIONS = "functions."


@functools.cache
def encoding() -> Any:
    try:
        from openai_harmony import HarmonyEncodingName, load_harmony_encoding
    except ImportError as e:
        raise RuntimeError(
            "--tool-call-parser openai (gpt-oss) reads answers with openai-harmony: "
            "pip install 'rolltap[harmony]'"
        ) from e
    return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)


def _recipient(found: str | None) -> str | None:
    """A recipient without a `<|constrain|>` an older parser read into it."""
    if found is None:
        return None
    return found.split("<|constrain|>", 1)[0].rstrip() or None


def _kind(channel: str | None, recipient: str | None) -> str:
    if recipient is not None and recipient.startswith(_FUNCTIONS):
        return "call"
    if channel == "analysis":
        return "reasoning"
    if channel == "final" or (channel == "commentary" and recipient is None):
        return "content"
    return "ignored"


@dataclass
class HarmonyDelta:
    reasoning: str = ""
    content: str = ""
    calls: list[CallPart] | None = None


class HarmonyAnswer:
    """One gpt-oss answer, its token ids pushed as they arrive. Streamed (`stream`), each
    message's text goes out as it is written (a call opens at its recipient, its arguments
    follow as written); whole, each complete message is read at the end: content and reasoning
    messages joined by newlines, a call's JSON arguments as `json.dumps` writes them."""

    def __init__(self, *, reasoning: bool, tools: bool, stream: bool) -> None:
        from openai_harmony import Role, StreamableParser

        self._parser = StreamableParser(encoding(), role=Role.ASSISTANT)
        self._reasoning, self._tools, self._stream = reasoning, tools, stream
        self._recipient: str | None = None
        """The recipient of the message being streamed (None: no call is open)."""
        self._done = 0
        """Complete messages read."""
        self._pending: list[int] = []
        """Ids of the message not yet complete (its text, should the answer break off)."""
        self.calls = 0
        self.malformed: str | None = None

    @property
    def outcome(self) -> str:
        return parse_outcome(self.calls, self.malformed)

    def push(self, ids: list[int]) -> HarmonyDelta:
        from openai_harmony import HarmonyError

        out = HarmonyDelta(calls=[])
        for token in ids:
            try:
                self._parser.process(token)
            except HarmonyError as e:
                self._note(f"not Harmony ({e})")
                continue
            self._pending.append(token)
            recipient = _recipient(self._parser.current_recipient)
            delta = self._parser.last_content_delta or ""
            if self._complete():
                self._pending = []
                self._recipient = None
                continue
            if self._stream:
                self._streamed(self._parser.current_channel, recipient, delta, out)
        return out

    def finish(self) -> HarmonyDelta:
        from openai_harmony import HarmonyError

        out = HarmonyDelta(calls=[])
        try:
            self._parser.process_eos()
        except HarmonyError:
            # It broke off inside a message: its text is the answer's content, as vLLM has it.
            out.content = encoding().decode(self._pending)
            self._note("cut inside a message")
            return out if self._stream else self._whole(out)
        self._complete()
        return out if self._stream else self._whole(out)

    def _complete(self) -> bool:
        """Read the messages completed since the last look; whether there was one."""
        messages = self._parser.messages
        found = len(messages) > self._done
        for message in messages[self._done :]:
            self._check(message)
        self._done = len(messages)
        return found

    def _check(self, message: Any) -> None:
        recipient = _recipient(message.recipient)
        if _kind(message.channel, recipient) != "call" or not message.content:
            return
        content_type = message.content_type
        if content_type is not None and "json" not in content_type:
            self.calls += 1
            return
        try:
            json.loads(message.content[0].text)
        except ValueError as e:
            self._note(f"tool call {self.calls + 1}: arguments not JSON ({e})")
            return
        self.calls += 1

    def _note(self, why: str) -> None:
        if self.malformed is None:
            self.malformed = why

    def _streamed(
        self, channel: str | None, recipient: str | None, delta: str, out: HarmonyDelta
    ) -> None:
        kind = _kind(channel, recipient)
        if kind == "reasoning" and self._reasoning:
            out.reasoning += delta
        elif kind == "content":
            out.content += delta
        elif kind == "call" and self._tools and recipient is not None:
            assert out.calls is not None
            if recipient != self._recipient:
                self._recipient = recipient
                out.calls.append(CallPart(delta, new_call_id(), recipient[len(_FUNCTIONS) :]))
            elif delta:
                out.calls.append(CallPart(delta))

    def _whole(self, out: HarmonyDelta) -> HarmonyDelta:
        from openai_harmony import Role

        reasoning: list[str] = []
        content: list[str] = []
        calls: list[CallPart] = []
        for message in self._parser.messages:
            if message.author.role != Role.ASSISTANT or not message.content:
                continue
            text = message.content[0].text
            recipient = _recipient(message.recipient)
            kind = _kind(message.channel, recipient)
            if kind == "reasoning" and self._reasoning and text:
                reasoning.append(text)
            elif kind == "content" and text:
                content.append(text)
            elif kind == "call" and self._tools and recipient is not None:
                name = recipient[len(_FUNCTIONS) :]
                calls.append(CallPart(_arguments(message, text), new_call_id(), name))
        if out.content:
            content.append(out.content)
        return HarmonyDelta("\n".join(reasoning), "\n".join(content), calls)


def _arguments(message: Any, text: str) -> str:
    content_type = message.content_type
    if content_type is not None and "json" not in content_type:
        return str(text)
    try:
        return json.dumps(json.loads(text), ensure_ascii=False)
    except ValueError:
        return str(text)
