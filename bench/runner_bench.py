"""Runner benchmarks: prints a table of latencies, one measurement per function.

    python bench/runner_bench.py [--kinds local,bwrap,docker] [--n 50]

Sandbox part: per kind, `create` (a sandbox ready for commands, proxy forwarder included),
`first exec` (`true`, through the forwarder), `close`, and `start` = create + first exec (what a
rollout waits for before its harness can run). Kinds that cannot run here are reported as skipped.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from rolltap.runner.sandboxes.base import SandboxProvider, SandboxSpec
from rolltap.runner.sandboxes.errors import SandboxUnavailable
from rolltap.runner.sandboxes.kinds import make_provider
from rolltap.runner.tasks import Task, TaskEnvironment


@dataclass(frozen=True)
class Row:
    measurement: str
    samples_ms: Sequence[float]

    def cells(self) -> tuple[str, str, str, str, str]:
        s = sorted(self.samples_ms)
        p99 = s[min(len(s) - 1, round(0.99 * (len(s) - 1)))]
        return (
            self.measurement,
            str(len(s)),
            f"{statistics.median(s):.1f}",
            f"{p99:.1f}",
            f"{max(s):.1f}",
        )


def print_table(rows: Sequence[Row | tuple[str, str]]) -> None:
    header = ("measurement", "n", "p50 ms", "p99 ms", "max ms")
    lines = [header] + [r.cells() if isinstance(r, Row) else (r[0], r[1], "", "", "") for r in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for i, line in enumerate(lines):
        print(
            "  ".join(
                c.ljust(w) if j == 0 else c.rjust(w)
                for j, (c, w) in enumerate(zip(line, widths, strict=True))
            )
        )
        if i == 0:
            print("  ".join("-" * w for w in widths))


async def sandbox_start_stop(kind: str, n: int, proxy_socket: Path) -> list[Row]:
    """create / first exec / close latencies of `kind` over n sandboxes, one after another."""
    root = Path(tempfile.mkdtemp(prefix="rolltap-bench-"))
    task = Task(
        id="bench", instruction="-", source=root, workdir="/app", environment=TaskEnvironment()
    )
    provider: SandboxProvider = await make_provider(kind, root=root)
    create, first, close, start = [], [], [], []
    try:
        for i in range(n + 1):
            spec = SandboxSpec(
                task=task, run_id="bench", rollout_id=f"r{i}", proxy_socket=proxy_socket
            )
            t0 = time.perf_counter()
            box = await provider.create(spec)
            t1 = time.perf_counter()
            result = await box.exec(["true"])
            t2 = time.perf_counter()
            await box.close()
            t3 = time.perf_counter()
            if not result.ok:
                raise RuntimeError(f"{kind}: `true` failed: {result.stderr}")
            if i == 0:
                continue  # warm-up: first image inspection, page cache
            create.append((t1 - t0) * 1e3)
            first.append((t2 - t1) * 1e3)
            close.append((t3 - t2) * 1e3)
            start.append((t2 - t0) * 1e3)
    finally:
        await provider.close()
        shutil.rmtree(root, ignore_errors=True)
    return [
        Row(f"{kind} create", create),
        Row(f"{kind} first exec", first),
        Row(f"{kind} start (create+exec)", start),
        Row(f"{kind} close", close),
    ]


async def with_proxy_socket(body: Callable[[Path], object]) -> None:
    directory = Path(tempfile.mkdtemp(prefix="rt-bench-", dir="/tmp"))
    runner = web.AppRunner(web.Application())
    await runner.setup()
    await web.UnixSite(runner, str(directory / "proxy.sock")).start()
    try:
        await body(directory / "proxy.sock")  # type: ignore[misc]
    finally:
        await runner.cleanup()
        shutil.rmtree(directory, ignore_errors=True)


async def main(kinds: Sequence[str], n: int) -> None:
    rows: list[Row | tuple[str, str]] = []

    async def run(sock: Path) -> None:
        for kind in kinds:
            try:
                rows.extend(await sandbox_start_stop(kind, n, sock))
            except SandboxUnavailable as e:
                rows.append((f"{kind}: skipped", str(e)))

    await with_proxy_socket(run)
    print_table(rows)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kinds", default="local,bwrap,docker")
    parser.add_argument("--n", type=int, default=50)
    args = parser.parse_args()
    asyncio.run(main(args.kinds.split(","), args.n))
