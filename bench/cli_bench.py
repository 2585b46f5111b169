"""CLI start-up: how long `rolltap` takes to answer before it does any work.

    python bench/cli_bench.py [--repeat 5]

Runs each command as a fresh process (the installed `rolltap` script) `--repeat` times on a
store with one finished rollout, and prints the median wall time beside two references: a bare
`python -c pass` (the floor) and importing every command module at once (what every command
paid before commands were imported lazily). Also the median CPU time (user + system) of the
process, which other load on the machine disturbs far less than the wall time.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rolltap.store import NewRollout, Store

ROLLTAP = str(Path(sys.executable).parent / "rolltap")
EVERY_COMMAND = (
    "import rolltap.cli.audit, rolltap.cli.db, rolltap.cli.export, rolltap.cli.harness, "
    "rolltap.cli.inspect, rolltap.cli.model, rolltap.cli.replay, rolltap.cli.run, "
    "rolltap.cli.serve, rolltap.cli.ui"
)


async def _store(url: str) -> str:
    store = await Store.connect(url)
    created = await store.create_rollout(NewRollout(batch_id="b", task_id="t"))
    await store.update_rollout(created.id, status="finished", reward=1.0)
    await store.close()
    return created.id


def _median(argv: list[str], repeat: int, env: dict[str, str]) -> tuple[float, float]:
    """Median wall and CPU seconds of `argv` run `repeat` times."""
    walls, cpus = [], []
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        subprocess.run(argv, env=env, check=True, capture_output=True)
        walls.append(time.perf_counter() - started)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return statistics.median(walls), statistics.median(cpus)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/bench.sqlite"
        rollout = asyncio.run(_store(url))
        env = {**os.environ, "ROLLTAP_DB": url}
        floor = _median([sys.executable, "-c", "pass"], args.repeat, env)
        eager = _median([sys.executable, "-c", EVERY_COMMAND], args.repeat, env)
        rows = [
            ("python -c pass (floor)", floor),
            ("import every command (before)", eager),
        ]
        for command in (
            ["--help"],
            ["ls", "--help"],
            ["ls"],
            ["show", "ROLLOUT"],
            ["run", "--help"],
        ):
            argv = [ROLLTAP, *(rollout if word == "ROLLOUT" else word for word in command)]
            rows.append((f"rolltap {' '.join(command)}", _median(argv, args.repeat, env)))
    print(f"{'command':<40} {'median s':>9} {'x floor':>8} {'x before':>9} {'CPU s':>7}")
    for name, (seconds, cpu) in rows:
        ratios = f"{seconds / floor[0]:>8.1f} {seconds / eager[0]:>9.2f}"
        print(f"{name:<40} {seconds:>9.3f} {ratios} {cpu:>7.3f}")


if __name__ == "__main__":
    main()
