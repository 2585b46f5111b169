"""CLI start-up: how long `rolltap` takes to answer before it does any work.

    python bench/cli_bench.py [--repeat 5] [--before DIR]

Runs each command as a fresh process (the installed `rolltap` script) `--repeat` times on a
store with one finished rollout, and prints the median wall time beside two references: a bare
`python -c pass` (the floor) and importing every command module at once (what every command
paid before commands were imported lazily). Also the median CPU time (user + system) of the
process, which other load on the machine disturbs far less than the wall time.

`--before DIR`: also each command from an older tree of rolltap (`git archive REV | tar -x -C
DIR`), run as `python -P -m rolltap.cli.main` with DIR first on the path, taking turns with the
current one, so that before and after share the machine's load.
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
from rolltap.store.events import Declared

ROLLTAP = str(Path(sys.executable).parent / "rolltap")
EVERY_COMMAND = (
    "import rolltap.cli.audit, rolltap.cli.db, rolltap.cli.export, rolltap.cli.harness, "
    "rolltap.cli.inspect, rolltap.cli.model, rolltap.cli.replay, rolltap.cli.run, "
    "rolltap.cli.serve, rolltap.cli.ui"
)


async def _store(url: str) -> str:
    store = await Store.connect(url)
    created = await store.create_rollout(NewRollout(batch_id="b", task_id="t"))
    await store.report(created.id, Declared("finished"), reward=1.0)
    await store.close()
    return created.id


Run = tuple[list[str], dict[str, str]]


def _medians(runs: list[Run], repeat: int) -> list[tuple[float, float]]:
    """Median wall and CPU seconds of each of `runs` run `repeat` times, taking turns."""
    walls: list[list[float]] = [[] for _ in runs]
    cpus: list[list[float]] = [[] for _ in runs]
    for _ in range(repeat):
        for i, (argv, env) in enumerate(runs):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            started = time.perf_counter()
            subprocess.run(argv, env=env, check=True, capture_output=True)
            walls[i].append(time.perf_counter() - started)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpus[i].append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return [(statistics.median(w), statistics.median(c)) for w, c in zip(walls, cpus, strict=True)]


def _median(argv: list[str], repeat: int, env: dict[str, str]) -> tuple[float, float]:
    return _medians([(argv, env)], repeat)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--before", type=Path, help="An older tree of rolltap to time beside.")
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
            ["ls", "--batches"],
            ["show", "ROLLOUT"],
            ["run", "--help"],
        ):
            words = [rollout if word == "ROLLOUT" else word for word in command]
            runs: list[Run] = [([ROLLTAP, *words], env)]
            if args.before is not None:
                older = {**env, "PYTHONPATH": str(args.before.absolute())}
                runs.append(([sys.executable, "-P", "-m", "rolltap.cli.main", *words], older))
            timed = _medians(runs, args.repeat)
            rows.append((f"rolltap {' '.join(command)}", timed[0]))
            if args.before is not None:
                rows.append((f"  before ({args.before.name})", timed[1]))
    print(f"{'command':<40} {'median s':>9} {'x floor':>8} {'x before':>9} {'CPU s':>7}")
    for name, (seconds, cpu) in rows:
        ratios = f"{seconds / floor[0]:>8.1f} {seconds / eager[0]:>9.2f}"
        print(f"{name:<40} {seconds:>9.3f} {ratios} {cpu:>7.3f}")


if __name__ == "__main__":
    main()
