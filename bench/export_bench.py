"""Trajectory benchmark: assembly and export speed over a store of multi-turn rollouts.

    python bench/export_bench.py [--rollouts 1000] [--turns 20] [--db URL] [--breaks 0.1]

Builds the store with the real Store API (one task per rollout, appending its turns in order, as
the proxy would): each rollout starts with a 600-token system prompt and each turn adds 120
tokens of tool output before an 80-token completion with logprobs. A share of rollouts
(--breaks) re-renders one earlier answer, so assembly also splits and classifies. Then reports:

* assembly: rollouts read, merged and classified into trajectories (numpy arrays), per second;
* export: the same, written to Parquet (pyarrow, zstd) and to JSON lines.

tokens/s counts prompt + response tokens of the trajectories produced.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

import rolltap.store
from rolltap.export.export import open_writer, write_all
from rolltap.store import (
    CallDialect,
    CallRecord,
    CallStatus,
    Capture,
    ChoiceRecord,
    NewRollout,
    Store,
)

SYSTEM, CONTEXT, COMPLETION, VOCAB = 600, 120, 80, 49_152


def _record(rollout_id: str, prompt: np.ndarray, completion: np.ndarray, turn: int) -> CallRecord:
    messages = [{"role": "user", "content": f"turn {turn}"}]
    return CallRecord(
        rollout_id=rollout_id,
        dialect=CallDialect.CHAT,
        status=CallStatus.OK,
        capture=Capture.TOKENS,
        received_at=datetime.now(UTC),
        prompt_ids=prompt,
        choices=[ChoiceRecord(0, completion, -np.linspace(0.01, 3.0, len(completion)), "stop")],
        request_body=json.dumps({"messages": messages}).encode(),
        response_body=json.dumps(
            {"choices": [{"index": 0, "message": {"content": "ok"}}]}
        ).encode(),
    )


async def build_store(
    url: str,
    rollouts: int,
    turns: int,
    breaks: float,
    *,
    samples: int = 1,
    batch: str = "bench",
    meta: dict[str, object] | None = None,
) -> float:
    """Rollouts `i` are sample `i % samples` of task `t{i // samples}` of `batch`."""
    store = await Store.connect(url)
    rng = np.random.default_rng(0)
    ids = [
        (
            await store.create_rollout(
                NewRollout(
                    batch_id=batch,
                    task_id=f"t{i // samples}",
                    sample_index=i % samples,
                    meta=dict(meta or {}),
                )
            )
        ).id
        for i in range(rollouts)
    ]

    async def rollout(index: int, rid: str) -> None:
        local = np.random.default_rng(index)
        prompt = local.integers(0, VOCAB, SYSTEM).astype(np.int32)
        broken_turn = int(local.integers(2, turns)) if local.random() < breaks else -1
        for turn in range(turns):
            completion = local.integers(0, VOCAB, COMPLETION).astype(np.int32)
            await store.append_call(_record(rid, prompt, completion, turn))
            sequence = np.concatenate([prompt, completion])
            if turn + 1 == broken_turn:
                # The template re-rendered the last answer: one token came back different.
                sequence = sequence.copy()
                sequence[-COMPLETION // 2] = (sequence[-COMPLETION // 2] + 1) % VOCAB
            prompt = np.concatenate([sequence, local.integers(0, VOCAB, CONTEXT).astype(np.int32)])
        await store.update_rollout(rid, status="finished", reward=float(rng.random()))

    start = time.perf_counter()
    await asyncio.gather(*(rollout(i, rid) for i, rid in enumerate(ids)))
    elapsed = time.perf_counter() - start
    await store.close()
    return elapsed


def _rate(n: float, seconds: float) -> str:
    return f"{n / seconds:,.0f}/s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rollouts", type=int, default=1000)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--breaks", type=float, default=0.1)
    parser.add_argument("--db", help="Database URL (default: a temporary SQLite file).")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = args.db or f"sqlite:///{Path(tmp) / 'bench.sqlite'}"
        built = asyncio.run(build_store(url, args.rollouts, args.turns, args.breaks))
        calls = args.rollouts * args.turns
        print(
            f"store: {args.rollouts} rollouts x {args.turns} turns = {calls} calls appended in "
            f"{built:.1f} s ({_rate(calls, built)})"
        )
        with rolltap.store.open(url) as reader:
            start = time.perf_counter()
            trajectories = tokens = breaks = 0
            for rt in reader.iter_rollout_trajectories(batch="bench"):
                trajectories += len(rt.trajectories)
                tokens += sum(t.n_tokens for t in rt.trajectories)
                breaks += sum(rt.faithfulness.breaks.values())
            took = time.perf_counter() - start
            print(
                f"assembly: {trajectories} trajectories ({breaks} breaks classified), "
                f"{tokens:,} tokens in {took:.2f} s: {_rate(trajectories, took)} trajectories, "
                f"{_rate(tokens, took)} tokens"
            )
            for fmt in ("parquet", "jsonl"):
                out = Path(tmp) / f"out.{fmt}"
                writer = open_writer(fmt, out)
                start = time.perf_counter()
                stats = write_all(reader.iter_rollout_trajectories(batch="bench"), writer)
                writer.close()
                took = time.perf_counter() - start
                size = out.stat().st_size / 2**20
                print(
                    f"export {fmt}: {stats.trajectories} trajectories, {stats.tokens:,} tokens "
                    f"in {took:.2f} s: {_rate(stats.trajectories, took)} trajectories, "
                    f"{_rate(stats.tokens, took)} tokens ({size:.1f} MiB)"
                )


if __name__ == "__main__":
    main()
