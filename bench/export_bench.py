"""Trajectory benchmark: assembly and export speed over a store of multi-turn rollouts.

    python bench/export_bench.py [--rollouts 1000] [--turns 20] [--db URL] [--breaks 0.1]
                                 [--rounds 2] [--before DIR]

Builds the store with the real Store API (one task per rollout, appending its turns in order, as
the proxy would): each rollout starts with a 600-token system prompt and each turn adds 120
tokens of tool output before an 80-token completion with logprobs. A share of rollouts
(--breaks) re-renders one earlier answer, so assembly also splits and classifies. Then reports:

* assembly: rollouts read, merged and classified into trajectories (numpy arrays), per second;
* export: the same, written to Parquet (pyarrow, zstd) and to JSON lines;
* the Parquet export as `rolltap export` runs it, once per fresh process and --rounds times: its
  wall time and the CPU time of the whole process (user + system, every thread), which a shared
  machine's load does not inflate the way it does wall time. `--before DIR`: also from an older
  tree of rolltap (`git archive REV | tar -x -C DIR`), each round beside the current one.

tokens/s counts prompt + response tokens of the trajectories produced.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

import rolltap.store
from rolltap.analysis import reader as blocking
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
from rolltap.store.events import Declared

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
        await store.report(rid, Declared("finished"), reward=float(rng.random()))

    start = time.perf_counter()
    await asyncio.gather(*(rollout(i, rid) for i, rid in enumerate(ids)))
    elapsed = time.perf_counter() - start
    await store.close()
    return elapsed


_EXPORT = """
import glob, json, os, sys, threading, time
import rolltap.store
from rolltap.export.export import open_writer, write_all

def threads():
    # CPU-s of each live thread by its Python name (Linux: /proc), SQLite's workers as one.
    names = {str(t.native_id): t.name for t in threading.enumerate()}
    found = {}
    for task in glob.glob("/proc/self/task/*"):
        try:
            fields = open(task + "/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        name = names.get(task.rsplit("/", 1)[1], "other")
        name = "sqlite" if "connection_worker" in name else name
        ticks = int(fields[11]) + int(fields[12])
        found[name] = found.get(name, 0) + ticks / os.sysconf("SC_CLK_TCK")
    return found

with rolltap.store.open(sys.argv[1], read_only=True) as reader:
    before, cpu, wall = threads(), time.process_time(), time.perf_counter()
    writer = open_writer("parquet", sys.argv[2])
    stats = write_all(blocking.iter_rollout_trajectories(reader, batch="bench"), writer)
    writer.close()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    split = {k: round(v - before.get(k, 0), 2) for k, v in threads().items()}
print(json.dumps({"tokens": stats.tokens, "cpu": cpu, "wall": wall, "threads": split}))
"""


def _fresh_export(tree: Path, url: str, out: Path) -> dict[str, Any]:
    """The Parquet export in a process of its own, importing rolltap from `tree`."""
    env = {**os.environ, "PYTHONPATH": str(tree.absolute())}
    done = subprocess.run(
        [sys.executable, "-c", _EXPORT, url, str(out)],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        cwd=tree,
    )
    figures: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return figures


def _rate(n: float, seconds: float) -> str:
    return f"{n / seconds:,.0f}/s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rollouts", type=int, default=1000)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--breaks", type=float, default=0.1)
    parser.add_argument("--db", help="Database URL (default: a temporary SQLite file).")
    parser.add_argument("--rounds", type=int, default=2, help="Fresh-process exports per tree.")
    parser.add_argument("--before", type=Path, help="An older tree of rolltap to export beside.")
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
            for rt in blocking.iter_rollout_trajectories(reader, batch="bench"):
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
                stats = write_all(blocking.iter_rollout_trajectories(reader, batch="bench"), writer)
                writer.close()
                took = time.perf_counter() - start
                size = out.stat().st_size / 2**20
                print(
                    f"export {fmt}: {stats.trajectories} trajectories, {stats.tokens:,} tokens "
                    f"in {took:.2f} s: {_rate(stats.trajectories, took)} trajectories, "
                    f"{_rate(stats.tokens, took)} tokens ({size:.1f} MiB)"
                )
        trees = [("this tree", Path(__file__).parent.parent)]
        if args.before is not None:
            trees.append((f"before ({args.before.name})", args.before))
        for round_ in range(1, args.rounds + 1):
            for name, tree in trees:
                got = _fresh_export(tree, url, Path(tmp) / "fresh.parquet")
                print(
                    f"export parquet, fresh process, round {round_}, {name}: "
                    f"{got['tokens']:,.0f} tokens in {got['cpu']:.2f} CPU-s "
                    f"({got['tokens'] / got['cpu'] / 1e6:.2f} M tokens per CPU-s), "
                    f"wall {got['wall']:.2f} s ({got['tokens'] / got['wall'] / 1e6:.2f} M tokens/s)"
                )
                split = sorted(got["threads"].items(), key=lambda kv: -kv[1])
                print("  CPU-s by thread: " + ", ".join(f"{k} {v:.2f}" for k, v in split if v))


if __name__ == "__main__":
    main()
