"""The engine's chat answer as a Responses API response: stream events and the whole object.

Output items, in the engine's order:
* reasoning -> a `reasoning` item: the text as `content[0]` (`reasoning_text`, as vLLM's own
  Responses API gives it), `summary: []`, and `encrypted_content` = the call's signed handle.
  When the client asked for `reasoning.encrypted_content` (Codex does) and the engine did not
  reason, an empty reasoning item still carries the handle, so every answer can be restored;
* text -> a `message` item with one `output_text` part;
* each tool call -> `function_call` (`call_id` = the engine's id, `namespace` for flattened
  namespace tools) or, for a custom tool, `custom_tool_call` with `input` = the `input` argument.

Events: `response.created`, `response.in_progress`; per item `output_item.added`, its parts and
deltas (`content_part.added`, `reasoning_text.delta`/`.done`, `output_text.delta`/`.done`,
`content_part.done`; `function_call_arguments.delta`/`.done`;
`custom_tool_call_input.delta`/`.done`), `output_item.done`; then `response.completed`, or
`response.incomplete` (finish_reason `length` -> `max_output_tokens`, `content_filter`), or
`response.failed` when the engine fails mid-answer. `sequence_number` counts from 0.
"""

from __future__ import annotations

import re
from typing import Any

from ..recall import EngineTurn
from .blocks import Close, Delta, Event, Open, Tool
from .dialect import Answer, AnswerEnd
from .history import dumps, parsed
from .responses_request import FREEFORM_ARGUMENT, chat_name, tool_specs

_SAFE_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


class ResponsesRenderer:
    def __init__(self, request: dict[str, Any], answer: Answer) -> None:
        self._answer = answer
        self._specs = tool_specs(request.get("tools"))
        include = request.get("include") or ()
        self._carrier = "reasoning.encrypted_content" in include
        self._seq = 0
        self._output: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None
        self._handed = False
        self.notes: list[str] = []
        self._response = {
            "id": f"resp_{answer.call_id}",
            "object": "response",
            "created_at": answer.created,
            "status": "in_progress",
            "background": False,
            "error": None,
            "incomplete_details": None,
            "instructions": request.get("instructions"),
            "max_output_tokens": request.get("max_output_tokens"),
            "model": request.get("model"),
            "output": self._output,
            "parallel_tool_calls": request.get("parallel_tool_calls", True),
            "previous_response_id": None,
            "reasoning": request.get("reasoning") or {"effort": None, "summary": None},
            "store": False,
            "temperature": request.get("temperature"),
            "text": request.get("text") or {"format": {"type": "text"}},
            "tool_choice": request.get("tool_choice", "auto"),
            "tools": request.get("tools") or [],
            "top_p": request.get("top_p"),
            "truncation": "disabled",
            "usage": None,
            "metadata": request.get("metadata") or {},
        }

    def start(self, prompt_tokens: int) -> list[dict[str, Any]]:
        return [
            self._event("response.created", response=self._snapshot()),
            self._event("response.in_progress", response=self._snapshot()),
        ]

    def feed(self, events: list[Event]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for event in events:
            if isinstance(event, Open):
                if event.kind == "text" and not self._handed and self._carrier:
                    out += self._reasoning_item("")
                out += self._open_item(event.kind)
            elif isinstance(event, Delta):
                out += self._delta(event.text)
            elif isinstance(event, Close):
                out += self._close_item()
            elif isinstance(event, Tool):
                if not self._handed and self._carrier:
                    out += self._reasoning_item("")
                out += self._tool_item(event)
        return out

    def finish(self, ending: AnswerEnd) -> list[dict[str, Any]]:
        out = self._close_item() if self._open is not None else []
        if not self._handed and self._carrier:
            out += self._reasoning_item("")
        reason = _INCOMPLETE.get(ending.finish_reason or "")
        self._response["status"] = "incomplete" if reason else "completed"
        self._response["incomplete_details"] = {"reason": reason} if reason else None
        self._response["usage"] = {
            "input_tokens": ending.prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": ending.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": ending.prompt_tokens + ending.completion_tokens,
        }
        kind = "response.incomplete" if reason else "response.completed"
        return [*out, self._event(kind, response=self._snapshot())]

    def fail(self, message: str, code: str | None) -> list[dict[str, Any]]:
        out = self._close_item() if self._open is not None else []
        self._response["status"] = "failed"
        self._response["error"] = {"code": code or "server_error", "message": message}
        return [*out, self._event("response.failed", response=self._snapshot())]

    def result(self) -> dict[str, Any]:
        return self._snapshot()

    # -- items -------------------------------------------------------------------------------

    def _open_item(self, kind: str) -> list[dict[str, Any]]:
        index = len(self._output)
        if kind == "reasoning":
            item: dict[str, Any] = {
                "id": f"rs_{self._answer.call_id}_{index}",
                "type": "reasoning",
                "summary": [],
                "content": [],
                "status": "in_progress",
            }
            part: dict[str, Any] = {"type": "reasoning_text", "text": ""}
        else:
            item = {
                "id": f"msg_{self._answer.call_id}_{index}",
                "type": "message",
                "role": "assistant",
                "status": "in_progress",
                "content": [],
            }
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        self._output.append(item)
        self._open = {"item": item, "index": index, "part": part, "text": []}
        return [
            self._event("response.output_item.added", output_index=index, item=_copy(item)),
            self._event(
                "response.content_part.added",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                part=dict(part),
            ),
        ]

    def _delta(self, text: str) -> list[dict[str, Any]]:
        assert self._open is not None
        self._open["text"].append(text)
        item = self._open["item"]
        kind = "reasoning_text" if item["type"] == "reasoning" else "output_text"
        extra: dict[str, Any] = {} if kind == "reasoning_text" else {"logprobs": []}
        return [
            self._event(
                f"response.{kind}.delta",
                item_id=item["id"],
                output_index=self._open["index"],
                content_index=0,
                delta=text,
                **extra,
            )
        ]

    def _close_item(self) -> list[dict[str, Any]]:
        assert self._open is not None
        opened, self._open = self._open, None
        item, index = opened["item"], opened["index"]
        text = "".join(opened["text"])
        part = {**opened["part"], "text": text}
        item["content"] = [part]
        item["status"] = "completed"
        reasoning = item["type"] == "reasoning"
        if reasoning:
            # Every reasoning item of one answer carries the same handle: that is how
            # interleaved ones are known to belong to one turn when they come back.
            item["encrypted_content"] = self._answer.handle
            self._handed = True
        kind = "reasoning_text" if reasoning else "output_text"
        extra: dict[str, Any] = {} if reasoning else {"logprobs": []}
        return [
            self._event(
                f"response.{kind}.done",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                text=text,
                **extra,
            ),
            self._event(
                "response.content_part.done",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                part=dict(part),
            ),
            self._event("response.output_item.done", output_index=index, item=_copy(item)),
        ]

    def _reasoning_item(self, text: str) -> list[dict[str, Any]]:
        """A whole reasoning item at once: the handle's carrier when the engine did not reason."""
        index = len(self._output)
        item: dict[str, Any] = {
            "id": f"rs_{self._answer.call_id}_{index}",
            "type": "reasoning",
            "summary": [],
            "content": [],
            "encrypted_content": self._answer.handle,
            "status": "completed",
        }
        self._output.append(item)
        self._handed = True
        added = {**item, "status": "in_progress"}
        del added["encrypted_content"]
        return [
            self._event("response.output_item.added", output_index=index, item=added),
            self._event("response.output_item.done", output_index=index, item=_copy(item)),
        ]

    def _tool_item(self, call: Tool) -> list[dict[str, Any]]:
        index = len(self._output)
        call_id = _client_id(call, self._answer.call_id)
        spec = self._specs.get(call.name)
        if spec is not None and spec.custom:
            return self._custom_item(index, call_id, spec.name, call.arguments)
        item: dict[str, Any] = {
            "id": f"fc_{self._answer.call_id}_{index}",
            "type": "function_call",
            "call_id": call_id,
            "name": spec.name if spec is not None else call.name,
            "arguments": "",
            "status": "in_progress",
        }
        if spec is not None and spec.namespace:
            item["namespace"] = spec.namespace
        self._output.append(item)
        added = _copy(item)
        item["arguments"] = call.arguments
        item["status"] = "completed"
        return [
            self._event("response.output_item.added", output_index=index, item=added),
            self._event(
                "response.function_call_arguments.delta",
                item_id=item["id"],
                output_index=index,
                delta=call.arguments,
            ),
            self._event(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=index,
                name=item["name"],
                arguments=call.arguments,
            ),
            self._event("response.output_item.done", output_index=index, item=_copy(item)),
        ]

    def _custom_item(
        self, index: int, call_id: str, name: str, arguments: str
    ) -> list[dict[str, Any]]:
        value = parsed(arguments)
        text = value.get(FREEFORM_ARGUMENT) if isinstance(value, dict) else None
        # A model that ignored the wrapper still has its input passed on, as it wrote it.
        tool_input = text if isinstance(text, str) else arguments
        item: dict[str, Any] = {
            "id": f"ctc_{self._answer.call_id}_{index}",
            "type": "custom_tool_call",
            "call_id": call_id,
            "name": name,
            "input": "",
            "status": "in_progress",
        }
        self._output.append(item)
        added = _copy(item)
        item["input"] = tool_input
        item["status"] = "completed"
        return [
            self._event("response.output_item.added", output_index=index, item=added),
            self._event(
                "response.custom_tool_call_input.delta",
                item_id=item["id"],
                output_index=index,
                delta=tool_input,
            ),
            self._event(
                "response.custom_tool_call_input.done",
                item_id=item["id"],
                output_index=index,
                input=tool_input,
            ),
            self._event("response.output_item.done", output_index=index, item=_copy(item)),
        ]

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return event

    def _snapshot(self) -> dict[str, Any]:
        return {**self._response, "output": [_copy(item) for item in self._output]}


def _copy(item: dict[str, Any]) -> dict[str, Any]:
    out = dict(item)
    if isinstance(out.get("content"), list):
        out["content"] = [dict(p) for p in out["content"]]
    return out


def _client_id(call: Tool, call_id: str) -> str:
    if call.engine_id and _SAFE_ID.fullmatch(call.engine_id):
        return call.engine_id
    return f"call_{call_id}_{call.index}"


def recorded_turn(body: bytes, choice: int) -> EngineTurn | None:
    """Choice 0 of a recorded Responses body, rebuilt as the engine's message (see recall.py)."""
    doc = parsed(body.decode(errors="replace"))
    if not isinstance(doc, dict) or choice != 0:
        return None
    reasoning: list[str] = []
    text: list[str] = []
    calls: list[dict[str, Any]] = []
    for item in doc.get("output") or ():
        kind = item.get("type")
        if kind == "reasoning":
            reasoning += [c.get("text") or "" for c in item.get("content") or ()]
        elif kind == "message":
            text += [p.get("text") or "" for p in item.get("content") or ()]
        elif kind in ("function_call", "custom_tool_call"):
            if kind == "function_call":
                name = chat_name(item.get("namespace"), str(item.get("name")))
                arguments = str(item.get("arguments") or "")
            else:
                name = str(item.get("name"))
                arguments = dumps({FREEFORM_ARGUMENT: item.get("input") or ""})
            calls.append(
                {
                    "id": item.get("call_id"),
                    "type": "function",
                    "function": {"name": name, "arguments": arguments},
                }
            )
    message: dict[str, Any] = {
        "role": "assistant",
        "content": "".join(text) if text or not calls else None,
    }
    if any(reasoning):
        message["reasoning_content"] = "".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    return EngineTurn(message)
