"""A batch to kill and resume: `python -m tests.support.resumable_batch DB WORKDIR MARKER [--fast]`.

Three copies of hello-file x 2 samples, two at a time, in the local sandbox, behind a fake
engine. The harness solves the task, then (without --fast) sleeps, so a kill lands while some
rollouts are done and others are mid-harness. MARKER gets the ids of finished rollouts.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
from pathlib import Path

from rolltap.runner import BatchProgress, run_batch
from rolltap.runner.sandboxes.local import LocalProvider
from rolltap.runner.tasks import load_tasks
from tests.support.fake_harness import ShellHarness, cleanup, shell_installation
from tests.support.proxy import fake_engine

ROOT = Path(__file__).resolve().parents[2]


async def main(db: str, workdir: Path, marker: Path, fast: bool) -> None:
    hello = next(t for t in load_tasks(ROOT / "examples" / "tasks") if t.id == "hello-file")
    tasks = [dataclasses.replace(hello, id=f"hello-{i}") for i in range(3)]
    script = 'python3 "$ROLLTAP_ASK" hi && echo hello > hello.txt' + ("" if fast else "; sleep 3")
    progress = BatchProgress()
    installed = shell_installation()

    async def report() -> None:
        while True:
            marker.write_text(" ".join(str(i) for i in range(progress.done)))
            await asyncio.sleep(0.05)

    reporter = asyncio.get_running_loop().create_task(report())
    try:
        async with fake_engine() as engine:
            provider = LocalProvider(workdir / "boxes")
            try:
                await run_batch(
                    tasks,
                    harness=ShellHarness(script),
                    installed=installed,
                    sandbox=provider,
                    samples=2,
                    concurrency=2,
                    backends=[engine.url],
                    batch="resumable",
                    db=db,
                    logs_root=workdir / "logs",
                    progress=progress,
                )
            finally:
                await provider.close()
    finally:
        reporter.cancel()
        cleanup(installed)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("db")
    parser.add_argument("workdir", type=Path)
    parser.add_argument("marker", type=Path)
    parser.add_argument("--fast", action="store_true")
    args = parser.parse_args()
    asyncio.run(main(args.db, args.workdir, args.marker, args.fast))
