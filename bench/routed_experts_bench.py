"""Routing replay (R3) storage: bytes per token the store keeps for routed experts.

    python bench/routed_experts_bench.py [--turns 16] [--observation 400] [--answer 120]

One multi-turn rollout per model shape goes through the real proxy (`capture_routed_experts`)
to the fake MoE engine of the test suite, which answers in the engine's own wire format: SGLang
token-in (`/generate`, bridged turns) and vLLM chat (normal mode, whole answers). Each turn adds
an observation of `--observation` tokens and an answer of `--answer` tokens. Reported per token of
the rollout's final sequence (its unique tokens):

* stored: the `routed_experts` table's data (each call keeps only the rows after the prefix its
  predecessor already holds; store/routed.py);
* per call, undeduplicated: every call's whole array (prompt and answer rows), what storing each
  answer as sent would cost;
* on the wire: what the engine sent for all calls (base64 of int32 / of the .npy file);
* token ids: the store's own ids for the same rollout (prompt deltas and sampled ids), to
  compare.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path
from typing import Any

import openai
from sqlalchemy import func, select

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the fake engine of the test suite

from rolltap.analysis.reading import rollout_trajectories  # noqa: E402
from rolltap.store import NewRollout, RolloutStatus, Store  # noqa: E402
from rolltap.store.events import Declared  # noqa: E402
from rolltap.store.models import call_table, choice_table, routed_experts_table  # noqa: E402
from tests.support.fake_vllm import FakeVLLM, Reply  # noqa: E402
from tests.support.proxy import fake_engine, running_proxy  # noqa: E402

SHAPES = [
    ("Qwen3-30B-A3B", 48, 8, 128),
    ("DeepSeek-V3", 58, 8, 256),
    ("Kimi-K2", 60, 8, 384),
]


async def _rollout(store: Store, sglang: bool, args: argparse.Namespace, shape: Any) -> str:
    _, layers, topk, experts = shape
    answer = "a" * (args.answer - 1)
    fake = FakeVLLM(
        sglang=sglang,
        moe=(layers, topk, experts),
        script=lambda body: Reply(text=answer),
        completion_text=answer,
        record_requests=False,
    )
    meta = {"token_in": True} if sglang else {}
    async with (
        fake_engine(fake) as engine,
        running_proxy(
            store, ("sglang=" if sglang else "") + engine.url, capture_routed_experts=True
        ) as proxy,
    ):
        created = await store.create_rollout(NewRollout(task_id="bench", meta=meta))
        client = openai.AsyncOpenAI(base_url=f"{proxy.url}/r/{created.key}/v1", api_key="x")
        messages: list[Any] = []
        try:
            for turn in range(args.turns):
                observation = f"{turn:04d}" * (args.observation // 4)
                messages.append({"role": "user", "content": observation})
                reply = await client.chat.completions.create(model="m", messages=messages)
                messages.append({"role": "assistant", "content": reply.choices[0].message.content})
        finally:
            await client.close()
    await store.report(created.id, Declared(RolloutStatus.SUCCEEDED))
    return created.id


async def _sizes(store: Store, rollout_id: str) -> dict[str, int]:
    R, C, CH = routed_experts_table, call_table, choice_table
    async with store.db.connect() as conn:
        stored = await conn.scalar(
            select(func.sum(func.length(R.c.data))).where(R.c.rollout_id == rollout_id)
        )
        suffix = await conn.scalar(
            select(func.sum(func.length(C.c.prompt_suffix))).where(C.c.rollout_id == rollout_id)
        )
        sampled = await conn.scalar(
            select(func.sum(func.length(CH.c.token_ids)))
            .join(C, C.c.id == CH.c.call_id)
            .where(C.c.rollout_id == rollout_id)
        )
    whole = await store.routed_experts(rollout_id)
    (t,) = (await rollout_trajectories(store, rollout_id)).trajectories
    return {
        "tokens": t.n_tokens,
        "stored": int(stored or 0),
        "per_call": sum(a.nbytes for a in whole.values()),
        "elements": sum(a.size for a in whole.values()),
        "ids": int(suffix or 0) + int(sampled or 0),
        "calls": len(whole),
    }


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=16)
    parser.add_argument("--observation", type=int, default=400, help="tokens per observation")
    parser.add_argument("--answer", type=int, default=120, help="tokens per answer")
    args = parser.parse_args()
    print(
        f"{args.turns} turns of {args.observation} observation + {args.answer} answer tokens; "
        "bytes per token of the rollout's final sequence"
    )
    header = (
        f"{'engine':<12}{'model (layers x top-k, experts)':<38}{'dtype':>7}{'stored':>8}"
        f"{'per call':>10}{'wire':>8}{'ids':>6}"
    )
    print(header)
    with tempfile.TemporaryDirectory() as tmp:
        for sglang in (True, False):
            engine = "SGLang" if sglang else "vLLM"
            for shape in SHAPES:
                name, layers, topk, experts = shape
                store = await Store.connect(f"sqlite:///{tmp}/{engine}{layers}.sqlite")
                try:
                    sizes = await _sizes(store, await _rollout(store, sglang, args, shape))
                finally:
                    await store.close()
                tokens = sizes["tokens"]
                row = layers * topk
                dtype = "uint8" if experts <= 256 else "uint16"
                # SGLang: base64 of int32; vLLM: base64 of the .npy file (its int32 payload).
                wire = sizes["elements"] * 4 * 4 / 3
                model = f"{name} ({layers}x{topk}={row}, {experts})"
                print(
                    f"{engine:<12}{model:<38}{dtype:>7}{sizes['stored'] / tokens:>8.0f}"
                    f"{sizes['per_call'] / tokens:>10.0f}{wire / tokens:>8.0f}"
                    f"{sizes['ids'] / tokens:>6.1f}"
                )
    print(
        "stored: layers x top-k x the dtype's size per token, each prefix once (SGLang: token-in "
        "turns; vLLM: normal-mode chat); per call and wire grow with the turns."
    )


if __name__ == "__main__":
    asyncio.run(main())
