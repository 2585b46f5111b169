"""Measure mini-swe-agent on the built-in engine: rejected answers, rewards, segments.

    python examples/mswea_measure.py --adapter default --batch after-normal
    python examples/mswea_measure.py --adapter none --batch before-token-in --token-in

runs `rolltap run examples/tasks` (the held-out tasks: no training task of
examples/mswea_adapter.py is one of them) with the real mini-swe-agent in bubblewrap sandboxes
on the built-in engine, with or without the adapter, then reads the store and the harness's own
trajectories and prints one JSON object:

- `rejected`: answers mini-swe-agent refused (its FormatError: no tool call, a malformed one,
  an answer cut at the output limit), over all the model's answers, from the trajectory files;
- `solved`: rollouts whose task's test gave reward > 0;
- `one_segment`: rollouts whose token chain is one segment; `in_context`: the share of sampled
  tokens still in the context they were sampled in (pooled over the batch, and the lowest
  rollout's); both from rolltap's own analysis.

`--no-run` only reads an earlier batch of the same name.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import platformdirs

HERE = Path(__file__).resolve().parent


def run(args: argparse.Namespace) -> None:
    argv = [
        sys.executable,
        "-m",
        "rolltap.cli.main",
        "run",
        str(args.tasks),
        "--harness",
        "mini-swe-agent",
        "--sandbox",
        args.sandbox,
        "-n",
        str(args.samples),
        "-c",
        str(args.concurrency),
        "--max-steps",
        str(args.max_steps),
        "--max-calls",
        str(args.max_steps * 2),
        "--adapter",
        args.adapter,
        "--db",
        args.db,
        "--batch",
        args.batch,
    ]
    for pair in args.sampling:
        argv += ["--sampling", pair]
    if args.token_in:
        argv.append("--token-in")
    print("$ rolltap " + " ".join(argv[3:]), file=sys.stderr, flush=True)
    subprocess.run(argv, check=True)


async def figures(db: str, batch: str) -> dict[str, Any]:
    from rolltap.store import Store

    store = await Store.connect(db)
    try:
        rollouts = await store.rollouts(batch=batch, limit=100000)
        rollouts = [r for r in rollouts if r.status.value != "cancelled"]
        analyses = await store.analyses([r.id for r in rollouts])
        answers = rejected = 0
        untraced = 0
        per_rollout = []
        for r in rollouts:
            traj = _trajectory(batch, r.id)
            calls = await store.calls(r.id)
            if traj is None:
                # Killed before mini-swe-agent wrote its trajectory: judge from the records.
                untraced += 1
                n = len(calls)
                bad = sum(1 for c in calls if c.tool_parse != "ok" or c.finish_reason == "length")
            else:
                n, bad = _answers(traj)
            answers, rejected = answers + n, rejected + bad
            a = analyses.get(r.id)
            per_rollout.append(
                {
                    "task": r.task_id,
                    "status": r.status.value,
                    "reward": r.reward,
                    "answers": n,
                    "rejected": bad,
                    "segments": a.segments if a else None,
                    "in_context": round(a.share, 4) if a else None,
                }
            )
        sampled = sum(a.sampled_tokens for a in analyses.values())
        lost = sum(a.lost_tokens for a in analyses.values())
        shares = [a.share for a in analyses.values()]
        return {
            "batch": batch,
            "rollouts": len(rollouts),
            "answers": answers,
            "rejected": rejected,
            "rejected_share": round(rejected / answers, 4) if answers else None,
            "solved": sum(1 for r in rollouts if (r.reward or 0) > 0),
            "solved_tasks": sorted({r.task_id for r in rollouts if (r.reward or 0) > 0}),
            "one_segment": sum(1 for a in analyses.values() if a.segments == 1),
            "in_context": round(1 - lost / sampled, 4) if sampled else None,
            "in_context_lowest": round(min(shares), 4) if shares else None,
            "at_least_90": sum(1 for s in shares if s >= 0.9),
            "untraced": untraced,
            "per_rollout": per_rollout,
        }
    finally:
        await store.close()


def _trajectory(batch: str, rollout_id: str) -> dict[str, Any] | None:
    runs = platformdirs.user_data_path("rolltap") / "runs" / batch / rollout_id
    path = runs / "agent" / "mini-swe-agent.traj.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _answers(traj: dict[str, Any]) -> tuple[int, int]:
    """The model's answers and how many of them mini-swe-agent refused: a refused answer leaves
    no assistant message, only the FormatError message asking again."""
    messages = [m for m in traj.get("messages") or [] if isinstance(m, dict)]
    kept = sum(1 for m in messages if m.get("role") == "assistant")
    refused = sum(
        1 for m in messages if (m.get("extra") or {}).get("interrupt_type") == "FormatError"
    )
    return kept + refused, refused


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", required=True)
    parser.add_argument("--adapter", default="default", help="default, none or a file")
    parser.add_argument("--db", default="sqlite:////tmp/mswea-measure.db")
    parser.add_argument("--tasks", type=Path, default=HERE / "tasks")
    parser.add_argument("--sandbox", default="bwrap")
    parser.add_argument("--samples", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=3)
    parser.add_argument("--max-steps", type=int, default=6)
    parser.add_argument("--sampling", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--token-in", action="store_true")
    parser.add_argument("--no-run", action="store_true", help="only read the batch")
    args = parser.parse_args()
    if not args.no_run:
        run(args)
    result = asyncio.run(figures(args.db, args.batch))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
