"""A separate writer process for concurrency and crash tests.

`python -m tests.support.store_writer URL --calls N [--rollout ID] [--parallel P]` appends N
calls (P in flight at once, so the writer batches them) and prints `ACK <call_id> <i>` after each
one is durable. Call i's tokens are derived from (tag, i), so a reader can check every byte.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import numpy as np

from rolltap.store import NewRollout, Store
from tests.support.records import call


def tokens_for(tag: int, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng([tag, i])
    prompt = rng.integers(0, 100_000, 64 + i % 7)
    completion = rng.integers(0, 100_000, 16 + i % 5)
    logprobs = -rng.exponential(1.0, len(completion)).astype(np.float32)
    return prompt, completion, logprobs


async def main(url: str, calls: int, rollout_id: str | None, parallel: int, tag: int) -> None:
    store = await Store.connect(url)
    if rollout_id is None:
        rollout_id = (await store.create_rollout(NewRollout(task_id=f"writer-{tag}"))).id
    print(f"ROLLOUT {rollout_id}", flush=True)
    semaphore = asyncio.Semaphore(parallel)

    async def one(i: int) -> None:
        async with semaphore:
            prompt, completion, logprobs = tokens_for(tag, i)
            record = call(rollout_id, prompt, completion, logprobs=[logprobs], purpose=f"{tag}:{i}")
            receipt = await store.append_call(record)
            sys.stdout.write(f"ACK {receipt.call_id} {i}\n")
            sys.stdout.flush()

    await asyncio.gather(*(one(i) for i in range(calls)))
    await store.close()
    print("DONE", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--calls", type=int, required=True)
    parser.add_argument("--rollout")
    parser.add_argument("--parallel", type=int, default=8)
    parser.add_argument("--tag", type=int, default=0)
    args = parser.parse_args()
    asyncio.run(main(args.url, args.calls, args.rollout, args.parallel, args.tag))
