"""Reading a streamed chat answer as a client does."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def add_call_deltas(calls: list[dict[str, Any]], deltas: Iterable[Any]) -> None:
    """Fold one chunk's `delta.tool_calls` (openai SDK objects) into `calls`, as OpenAI's and
    vLLM's streams frame them: a call opens with its id and name, and its arguments may follow
    in fragments, which are concatenated."""
    for call in deltas:
        function = call.function
        if call.id is not None:
            assert call.index == len(calls), "a call opened out of order"
            opened = {"name": function.name if function else None, "arguments": ""}
            calls.append({"id": call.id, "type": "function", "function": opened})
        if function is not None and function.arguments:
            calls[call.index]["function"]["arguments"] += function.arguments
