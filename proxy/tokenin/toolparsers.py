"""Tool-call parsers for generated text, by vLLM's `--tool-call-parser` names.

Each takes the request's tools (some formats need the parameter types) and splits text pushed
piece by piece into content strings and `ToolCall`s, in order. Text that looks like a call but
does not parse is handed back as content, verbatim.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rolltap.engine.tools import ToolCall, ToolCallStream

Piece = str | ToolCall


def _hermes(tools: list[dict[str, Any]]) -> ToolCallStream:
    """`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Hermes, Qwen2.5, Qwen3)."""
    return ToolCallStream()


TOOL_PARSERS: dict[str, Callable[[list[dict[str, Any]]], Any]] = {"hermes": _hermes}
