"""A synthetic long agent rollout written through the store's real writer: the viewer's largest
page, for its browser test and `bench/ui_bench.py`.

Fifty turns of an agent that answers with text and a `bash` tool call and gets the command's
output back, growing to about 32k tokens. Each prompt extends the previous prompt plus the
sampled answer, as a token-faithful harness's does, except once: halfway, the harness sends an
earlier answer back shortened, a `history_edited` break. With a tokenizer the ids are the real
ids of the text (so token strips read as text); without one they are random ids.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np

from rolltap.analysis.reading import analyze_rollout
from rolltap.store import (
    CallDialect,
    CallRecord,
    CallStatus,
    Capture,
    ChoiceRecord,
    NewRollout,
    Store,
)
from rolltap.store.events import Declared

WORDS = [
    "the",
    "file",
    "test",
    "function",
    "import",
    "return",
    "value",
    "error",
    "line",
    "module",
    "class",
    "python",
    "patch",
    "fix",
    "check",
    "run",
    "output",
    "path",
    "config",
    "parse",
    "token",
    "stream",
    "call",
    "store",
    "proxy",
    "answer",
    "result",
    "tests",
]
SYSTEM = "You are a coding agent. Use the bash tool to inspect and change the repository."
TASK = "The test tests/test_parse.py::test_empty fails. Find the bug and fix it."


@dataclass(frozen=True)
class BigRollout:
    rollout_id: str
    calls: int
    tokens: int
    """Tokens of the last call's prompt and answer."""


class _Ids:
    """Text to ids: the tokenizer's when there is one, else stable random ids per word."""

    def __init__(self, tokenizer: Any, rng: np.random.Generator) -> None:
        self._tokenizer = tokenizer
        self._rng = rng

    def __call__(self, text: str) -> np.ndarray:
        if self._tokenizer is not None:
            return np.asarray(self._tokenizer.encode(text, add_special_tokens=False))
        return self._rng.integers(3, 49_152, max(1, len(text) // 4))


def _text(rng: np.random.Generator, words: int) -> str:
    lines = []
    while words > 0:
        n = int(rng.integers(4, 14))
        lines.append(" ".join(rng.choice(WORDS, n)))
        words -= n
    return "\n".join(lines)


async def write_big_rollout(
    store: Store,
    *,
    turns: int = 50,
    tokens: int = 32_768,
    answer_tokens: int = 250,
    tokenizer: Any = None,
    seed: int = 0,
    batch: str = "big",
) -> BigRollout:
    rng = np.random.default_rng(seed)
    ids = _Ids(tokenizer, rng)
    created = await store.create_rollout(
        NewRollout(
            batch_id=batch, task_id="fix-parse", sample_index=0, harness="synthetic", model="big"
        )
    )
    rid = created.id
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": TASK},
    ]
    prompt = ids(f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{TASK}<|im_end|>\n")
    prompt = np.concatenate([prompt, ids("<|im_start|>assistant\n")])
    per_turn = max(1, (tokens - len(prompt)) // turns)
    sample = _text(np.random.default_rng(seed + 1), 2_000)
    per_word = len(ids(sample)) / len(sample.split())
    answer_words = max(1, int(answer_tokens / per_word))
    output_words = max(1, int((per_turn - answer_tokens - 12) / per_word))
    clock = datetime.now(UTC) - timedelta(minutes=30)
    break_at = turns // 2
    sampled = np.zeros(0, dtype=np.int64)
    for turn in range(turns):
        command = f"grep -n {rng.choice(WORDS)} src/parse.py"
        answer = _text(rng, answer_words)
        sampled = ids(answer + "<|im_end|>")
        arguments = json.dumps({"command": command})
        logprobs = -rng.exponential(0.4, len(sampled))
        received = clock
        clock += timedelta(milliseconds=int(rng.integers(200, 1500)))
        await store.append_call(
            CallRecord(
                rollout_id=rid,
                dialect=CallDialect.CHAT,
                status=CallStatus.OK,
                capture=Capture.TOKENS,
                received_at=received,
                dispatched_at=received + timedelta(milliseconds=3),
                first_token_at=received + timedelta(milliseconds=int(rng.integers(40, 400))),
                finished_at=clock,
                weight_version="v1" if turn < break_at else "v2",
                finish_reason="tool_calls",
                model="big",
                stream=True,
                prompt_ids=prompt,
                choices=[ChoiceRecord(0, sampled, logprobs, "tool_calls")],
                request_body=json.dumps({"model": "big", "messages": messages}).encode(),
                response_body=json.dumps(_response(answer, command)).encode(),
            )
        )
        clock += timedelta(milliseconds=int(rng.integers(50, 2000)))
        output = _text(rng, output_words)
        kept = answer
        if turn == break_at:
            # The harness trims the answer it sends back: the chain breaks in that answer.
            kept = answer[: len(answer) // 2]
            sampled = ids(kept + "<|im_end|>")
        messages += [
            {
                "role": "assistant",
                "content": kept,
                "tool_calls": [
                    {
                        "id": f"call_{turn}",
                        "type": "function",
                        "function": {"name": "bash", "arguments": arguments},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": f"call_{turn}", "content": output},
        ]
        glue = f"\n<|im_start|>tool\n{output}<|im_end|>\n<|im_start|>assistant\n"
        prompt = np.concatenate([prompt, sampled, ids(glue)])
    await store.report(
        rid,
        Declared("finished"),
        reward=1.0,
        meta={
            "verifier_tail": "1 passed in 0.03s",
            "harness_tail": "submitted",
            "logs_dir": "/tmp/big",
        },
    )
    await analyze_rollout(store, rid)
    return BigRollout(rid, turns, len(prompt))


def _response(answer: str, command: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-big",
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {
                    "role": "assistant",
                    "content": answer,
                    "tool_calls": [
                        {
                            "id": "call",
                            "type": "function",
                            "function": {
                                "name": "bash",
                                "arguments": json.dumps({"command": command}),
                            },
                        }
                    ],
                },
            }
        ],
    }
