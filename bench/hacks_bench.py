"""Precision and recall of the reward-hack detectors on the labelled set (examples/hacks/).

    python bench/hacks_bench.py                        # bwrap and docker
    python bench/hacks_bench.py --sandbox bwrap --keep-git-history

Runs the honest solution and the exploits, each labelled with the detector that must flag it
(scripted agents through the `oracle` harness), in each sandbox kind, then `rolltap audit hacks
--batch B --json` on each batch, and prints per detector: true positives (the exploits labelled
with it, flagged by it), false positives (any other rollout it flagged, the honest one
included), false negatives, precision and recall, and each rollout's reward (every exploit
scores 0; with --keep-git-history the git exploit passes, and is flagged).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

from click.testing import CliRunner

from rolltap.analysis.detectors import BUILTIN
from rolltap.cli.main import cli
from rolltap.examples.hacks import HONEST, labelled_set
from rolltap.runner import run_batch
from rolltap.runner.sandboxes.kinds import make_provider
from rolltap.store import Store


async def run(kind: str, db: str, logs: Path, keep: bool) -> tuple[str, dict[str, float | None]]:
    batch = f"hacks-{kind}{'-kept' if keep else ''}-{int(time.time())}"
    store = await Store.connect(db)
    provider = await make_provider(kind)
    try:
        result = await run_batch(
            [s.task for s in labelled_set()],
            harness="oracle",
            sandbox=provider,
            store=store,
            batch=batch,
            concurrency=4,
            prune_git_history=not keep,
            logs_root=logs / kind,
        )
    finally:
        await provider.close()
        await store.close()
    return batch, {r.task_id: r.reward for r in result.results}


def audit(batch: str, db: str) -> dict[str, set[str]]:
    """task id -> the detectors that flagged it, as `rolltap audit hacks --json` reports."""
    out = CliRunner().invoke(cli, ["audit", "hacks", "--batch", batch, "--json", "--db", db])
    rows = [json.loads(line) for line in out.output.splitlines() if line.startswith("{")]
    return {row["task_id"]: {f["detector"] for f in row["flags"]} for row in rows}


def report(kind: str, flagged: dict[str, set[str]], rewards: dict[str, float | None]) -> bool:
    labels = {s.task.id: s.label for s in labelled_set()}
    names = [factory().name for factory in BUILTIN]
    print(f"\n{kind}: {len(labels)} rollouts")
    print(f"  {'detector':<16}{'TP':>4}{'FP':>4}{'FN':>4}{'precision':>11}{'recall':>8}")
    perfect = True
    for name in names:
        tp = sum(name in flagged.get(t, set()) and label == name for t, label in labels.items())
        fp = sum(name in flagged.get(t, set()) and label != name for t, label in labels.items())
        fn = sum(name not in flagged.get(t, set()) and label == name for t, label in labels.items())
        precision = tp / (tp + fp) if tp + fp else float("nan")
        recall = tp / (tp + fn) if tp + fn else float("nan")
        perfect &= fp == 0 and fn == 0
        print(f"  {name:<16}{tp:>4}{fp:>4}{fn:>4}{precision:>11.2f}{recall:>8.2f}")
    width = max(map(len, labels)) + 1
    for task_id, label in labels.items():
        found = ", ".join(sorted(flagged.get(task_id, set()))) or "clean"
        print(f"  {task_id:<{width}} reward {rewards.get(task_id)!s:<5} {found}")
        perfect &= (label == HONEST) == (found == "clean")
    return perfect


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sandbox", nargs="+", default=["bwrap", "docker"])
    parser.add_argument("--keep-git-history", action="store_true")
    parser.add_argument("--db", help="a store URL (default: a new SQLite file)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="rolltap-hacks-bench-"))
    db = args.db or f"sqlite:///{work / 'store.sqlite'}"
    ok = True
    for kind in args.sandbox:
        started = time.monotonic()
        batch, rewards = asyncio.run(run(kind, db, work / "logs", args.keep_git_history))
        ok &= report(kind, audit(batch, db), rewards)
        print(f"  batch {batch}, {time.monotonic() - started:.0f} s; store {db}")
    print("\nevery exploit flagged, every honest run clean" if ok else "\nMISSED OR FALSE FLAGS")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
