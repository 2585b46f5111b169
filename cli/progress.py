"""A running batch, shown as it goes: a live bar in a terminal, one line per finished rollout
otherwise (a log, CI, a pipe), and Ctrl-C that stops the batch cleanly."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from ..runner import BatchProgress, RolloutResult
from ..store import Verdict

T = TypeVar("T")


class Interrupted(click.ClickException):
    exit_code = 130

    def __init__(self) -> None:
        super().__init__("interrupted; run the same command again to resume the batch")


def with_progress(
    console: Console,
    progress: BatchProgress,
    start: Callable[[Callable[[str], None]], Coroutine[Any, Any, T]],
) -> T:
    """Run the batch `start` makes (handing it a `say` for messages) while showing `progress`."""

    async def main() -> T:
        live = Live(_bar(progress), console=console, refresh_per_second=4)
        shown = 0
        with live if console.is_terminal else contextlib.nullcontext():

            def say(message: str) -> None:
                console.print(message)

            def update() -> None:
                nonlocal shown
                for result in progress.finished[shown:]:
                    shown += 1
                    console.print(rollout_line(shown, progress.total, result))
                if console.is_terminal:
                    live.update(_bar(progress))

            task = asyncio.get_running_loop().create_task(start(say))
            try:
                while not task.done():
                    update()
                    await asyncio.sleep(0.25)
            except asyncio.CancelledError:
                # Ctrl-C (asyncio.run cancels this task): stop the batch while the loop still
                # runs, so its rollouts are marked cancelled and its sandboxes and engine stop.
                say("interrupted: stopping the rollouts in flight...")
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                raise
            update()
            return task.result()

    try:
        return asyncio.run(main())
    except KeyboardInterrupt:
        raise Interrupted() from None


def rollout_line(n: int, total: int, r: RolloutResult) -> str:
    """`[3/16] hello-file#0 finished, reward 0 (failed) in 41 s: FAIL: hello.txt is missing`:
    how the run ended, the reward and its verdict, then the error, else the verifier's last
    line."""
    reward = "-" if r.reward is None else f"{r.reward:g} ({Verdict.of(r.reward).value})"
    reason = r.error or last_line(r.verifier_tail)
    seconds = r.seconds.get("total")
    took = "" if seconds is None else f" in {seconds:.0f} s"
    line = f"[{n}/{total}] {r.task_id}#{r.sample_index} {r.status.value}, reward {reward}{took}"
    return escape(line + (f": {reason[:160]}" if reason else ""))


def last_line(text: str | None) -> str:
    return (text or "").rstrip().rpartition("\n")[2]


def _bar(progress: BatchProgress) -> Table:
    elapsed = max(1e-6, time.monotonic() - progress.started_at)
    mean = sum(progress.rewards) / len(progress.rewards) if progress.rewards else None
    table = Table.grid(padding=(0, 2))
    width = 30
    filled = int(width * progress.done / progress.total) if progress.total else 0
    tokens = progress.tokens
    table.add_row(
        f"[{'#' * filled}{'.' * (width - filled)}]",
        f"done {progress.done}/{progress.total}",
        f"running {progress.running}",
        f"failed {progress.failed}",
        f"mean reward {'-' if mean is None else f'{mean:.3f}'}",
        f"{progress.calls:,.0f} calls",
        f"{tokens:,.0f} tokens ({tokens / elapsed:,.0f}/s)",
    )
    return table
