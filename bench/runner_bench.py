"""Runner benchmarks: prints a table of latencies, one measurement per function.

    python bench/runner_bench.py [--kinds local,bwrap,docker] [--n 50]

Sandbox part: per kind, `create` (a sandbox ready for commands, proxy forwarder included),
`first exec` (`true`, through the forwarder), `close`, and `start` = create + first exec (what a
rollout waits for before its harness can run). Kinds that cannot run here are reported as skipped.

Runner part (`--overhead N`, default 128): N rollouts of a trivial task at once, in bwrap, with a
harness that exits at once, through the real pipeline and proxy (a fake engine behind it). Per
rollout: total time, time inside sandbox operations (create, exec, put, get, close: timed by a
wrapper around the provider), and the runner's own overhead = total - sandbox time.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

# The runner part reuses the test suite's fakes (a shell harness, a fake engine).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rolltap.proxy.server import restrict_socket
from rolltap.runner.sandboxes.base import SandboxProvider, SandboxSpec
from rolltap.runner.sandboxes.errors import SandboxUnavailable
from rolltap.runner.sandboxes.identity import sandbox_user
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
    root.chmod(0o711)  # as root, bwrap runs as the sandbox user, who must reach its workspaces
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


class TimedSandbox:
    """Times every operation of a sandbox, so the pipeline's own time can be told apart."""

    def __init__(self, inner: Any, spent: list[float]) -> None:
        self._inner = inner
        self._spent = spent

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def _timed(self, op: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return await op(*args, **kwargs)
        finally:
            self._spent.append(time.perf_counter() - t0)

    async def exec(self, *args: Any, **kwargs: Any) -> Any:
        return await self._timed(self._inner.exec, *args, **kwargs)

    async def put(self, *args: Any, **kwargs: Any) -> Any:
        return await self._timed(self._inner.put, *args, **kwargs)

    async def get(self, *args: Any, **kwargs: Any) -> Any:
        return await self._timed(self._inner.get, *args, **kwargs)

    async def close(self) -> Any:
        return await self._timed(self._inner.close)


class TimedProvider:
    def __init__(self, inner: SandboxProvider) -> None:
        self.inner = inner
        self.kind = inner.kind
        self.spent: dict[str, list[float]] = {}

    async def create(self, spec: SandboxSpec) -> Any:
        spent = self.spent.setdefault(spec.rollout_id, [])
        t0 = time.perf_counter()
        box = await self.inner.create(spec)
        spent.append(time.perf_counter() - t0)
        return TimedSandbox(box, spent)

    async def sweep(self, run_id: str) -> int:
        return await self.inner.sweep(run_id)

    async def close(self) -> None:
        await self.inner.close()


async def runner_overhead(n: int, kind: str) -> list[Row]:
    """n trivial rollouts at once through run_batch; per-rollout total, sandbox and overhead."""
    from rolltap.runner import run_batch
    from tests.support.fake_harness import ShellHarness, cleanup, shell_installation
    from tests.support.proxy import fake_engine

    root = Path(tempfile.mkdtemp(prefix="rolltap-overhead-"))
    root.chmod(0o711)
    tasks = [
        Task(
            id=f"trivial-{i}",
            instruction="do nothing",
            source=root,
            workdir="/app",
            environment=TaskEnvironment(),
            test_script="exit 0",
            reward_from_exit_code=True,
        )
        for i in range(n)
    ]
    installed = shell_installation()
    provider = TimedProvider(await make_provider(kind, root=root / "boxes"))
    try:
        async with fake_engine() as engine:
            cpu0 = _cpu()
            t0 = time.perf_counter()
            result = await run_batch(
                tasks,
                harness=ShellHarness("true"),
                installed=installed,
                sandbox=provider,
                concurrency=n,
                backends=[engine.url],
                db=f"sqlite:///{root / 'store.sqlite'}",
                logs_root=root / "logs",
            )
            wall = time.perf_counter() - t0
            cpu = _cpu() - cpu0
    finally:
        await provider.close()
        cleanup(installed)
        shutil.rmtree(root, ignore_errors=True)
    failed = [r for r in result.results if r.reward != 1.0]
    if failed:
        raise RuntimeError(f"{len(failed)} trivial rollouts failed: {failed[0].error}")
    totals = [r.seconds["total"] * 1e3 for r in result.results]
    inside = [sum(provider.spent[r.rollout_id]) * 1e3 for r in result.results]
    overhead = [t - s for t, s in zip(totals, inside, strict=True)]
    return [
        (f"{n} rollouts at once ({kind})", f"all done in {wall:.1f} s"),
        (
            "  runner process CPU per rollout",
            f"{cpu / n * 1e3:.1f} ms (user+sys of this process, sandbox spawning included)",
        ),
        Row("rollout total", totals),
        Row("  inside the sandbox", inside),
        Row("  runner overhead", overhead),
    ]


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def with_proxy_socket(body: Callable[[Path], object]) -> None:
    directory = Path(tempfile.mkdtemp(prefix="rt-bench-", dir="/tmp"))
    runner = web.AppRunner(web.Application())
    await runner.setup()
    await web.UnixSite(runner, str(directory / "proxy.sock")).start()
    # As the runner's own proxy does (runner/host.py): owner and the sandboxes' group only.
    group = sandbox_user().gid
    restrict_socket(str(directory / "proxy.sock"), group)
    os.chown(directory, -1, group)
    directory.chmod(0o750)
    try:
        await body(directory / "proxy.sock")  # type: ignore[misc]
    finally:
        await runner.cleanup()
        shutil.rmtree(directory, ignore_errors=True)


async def main(kinds: Sequence[str], n: int, overhead: int) -> None:
    rows: list[Row | tuple[str, str]] = []

    async def run(sock: Path) -> None:
        for kind in kinds:
            try:
                rows.extend(await sandbox_start_stop(kind, n, sock))
            except SandboxUnavailable as e:
                rows.append((f"{kind}: skipped", str(e)))

    await with_proxy_socket(run)
    if overhead:
        rows.extend(await runner_overhead(overhead, "bwrap"))
    print_table(rows)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kinds", default="local,bwrap,docker")
    parser.add_argument("--n", type=int, default=50)
    parser.add_argument("--overhead", type=int, default=128, help="0 skips the runner part")
    args = parser.parse_args()
    asyncio.run(main(args.kinds.split(","), args.n, args.overhead))
