"""The end of `rolltap run`: the per-task table, why rollouts fell short, and where to look."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..runner import BatchResult, BatchSummary
from ..store import Verdict
from .progress import last_line

_EXPLAINED = 8
"""Rollouts short of full reward explained one by one; past that, `rolltap ls` lists them."""


def report(console: Console, result: BatchResult, db_url: str | None) -> None:
    print_summary(console, result.summary)
    explain(console, result, db_url)
    _hints(console, result, db_url)


def print_summary(console: Console, summary: BatchSummary) -> None:
    table = Table(title=f"batch {summary.batch_id}", header_style="bold")
    for column in ("task", "samples", "mean reward", "pass@1", "pass@k", "statuses"):
        table.add_column(column)
    for t in summary.tasks:
        table.add_row(
            t.task_id,
            str(t.samples),
            "-" if t.mean_reward is None else f"{t.mean_reward:.3f}",
            f"{t.pass_at_1:.3f}",
            f"{t.pass_at_k:.3f} (k={t.k})",
            ", ".join(f"{k} {v}" for k, v in sorted(t.statuses.items())),
        )
    console.print(table)
    mean = "-" if summary.mean_reward is None else f"{summary.mean_reward:.3f}"
    console.print(
        f"{summary.rollouts} rollouts in {summary.seconds:.1f} s; {summary.calls} calls, "
        f"{summary.tokens} tokens; mean reward {mean}"
    )


def _hints(console: Console, result: BatchResult, db_url: str | None) -> None:
    db = _db(db_url)
    if result.results:
        console.print(f"inspect a rollout: rolltap show {result.results[0].rollout_id}{db}")
    console.print(f"list the batch:    rolltap ls --batch {result.batch_id}{db}")
    console.print(f"export it:         rolltap export --batch {result.batch_id}{db}")


def explain(console: Console, result: BatchResult, db_url: str | None) -> None:
    """Each rollout short of full reward: its verifier's and harness's last words, its logs."""
    short = [r for r in result.results if r.reward != 1.0]
    if not short:
        return
    console.print(f"[bold]why {len(short)} rollout{'s' * (len(short) != 1)} fell short[/bold]")
    for r in short[:_EXPLAINED]:
        reward = "-" if r.reward is None else f"{r.reward:g} ({Verdict.of(r.reward).value})"
        console.print(f"  {escape(r.task_id)}#{r.sample_index} {r.status.value}, reward {reward}")
        if r.error:
            console.print(f"    error:    {escape(r.error[:300])}")
        if r.ending is not None:
            said = f": {r.harness_detail}" if r.harness_detail else ""
            console.print(f"    harness:  ended {r.ending.value}{escape(said[:200])}")
        for label, tail in (("verifier:", r.verifier_tail), ("log:", r.harness_tail)):
            if tail:
                console.print(f"    {label:<9} {escape(last_line(tail)[:200])}")
        console.print(f"    logs:     {r.logs_dir}")
        console.print(f"    show:     rolltap show {r.rollout_id}{_db(db_url)}")
    if len(short) > _EXPLAINED:
        more = len(short) - _EXPLAINED
        console.print(f"  ... and {more} more: rolltap ls --batch {result.batch_id}{_db(db_url)}")


def _db(db_url: str | None) -> str:
    return f" --db {db_url}" if db_url else ""
