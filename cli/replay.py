"""`rolltap replay ROLLOUT`: run a recorded rollout again against its own recorded answers.

Exit status: 0 the session reproduced (every call matched, the same reward); 1 it diverged
(a call differs, is extra or missing, or the reward differs); 2 it could not be replayed (no run
record, a changed or missing task, a missing harness, a sandbox or store failure).
"""

from __future__ import annotations

import asyncio
import json
import sys

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..audit.replay import CallReplay, Mode, Outcome, ReplayReport
from ..runner.harnesses.errors import HarnessError
from ..runner.replay import Replayed, ReplayError, replay_rollout
from ..runner.sandboxes.errors import SandboxUnavailable
from ..runner.sandboxes.kinds import KINDS
from ..runner.tasks import TaskFormatError
from ..store import StoreError
from ..store import open as open_store
from .options import db_option

REPRODUCED, DIVERGED, FAILED = 0, 1, 2
_CANNOT = (ReplayError, StoreError, HarnessError, SandboxUnavailable, TaskFormatError)
_STYLE = {
    Outcome.MATCHED: "green",
    Outcome.DIVERGED: "red",
    Outcome.EXTRA: "red",
    Outcome.MISSING: "red",
    Outcome.LIVE: "cyan",
    Outcome.STOPPED: "yellow",
}


@click.command()
@click.argument("rollout_id")
@click.option(
    "--sandbox", type=click.Choice(KINDS), help="Default: the sandbox the rollout ran in."
)
@click.option("--until-divergence", is_flag=True, help="Stop at the first call that differs.")
@click.option(
    "--continue-live",
    is_flag=True,
    help="From the first call that differs on, ask an engine (--backend, else the built-in "
    "one): a counterfactual continuation.",
)
@click.option(
    "--backend", "backends", multiple=True, metavar="[KIND=]URL", help="For --continue-live."
)
@click.option("--engine-model", help="For --continue-live: the built-in engine's model.")
@click.option(
    "--allow-task-change", is_flag=True, help="Replay even if the task's content changed since."
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
@db_option
def replay(
    rollout_id: str,
    sandbox: str | None,
    until_divergence: bool,
    continue_live: bool,
    backends: tuple[str, ...],
    engine_model: str | None,
    allow_task_change: bool,
    as_json: bool,
    db_url: str | None,
) -> None:
    """Run ROLLOUT's task again with the same harness and settings, its model calls answered
    from the record; report per call whether the harness sent the same request, and the
    reward. Exit status 0: reproduced; 1: diverged; 2: could not replay."""
    if until_divergence and continue_live:
        raise click.UsageError("choose one of --until-divergence and --continue-live")
    mode = Mode.REPLAY
    if until_divergence:
        mode = Mode.UNTIL_DIVERGENCE
    elif continue_live:
        mode = Mode.CONTINUE_LIVE
    console = Console(width=None if sys.stdout.isatty() else 200, highlight=False)
    err = Console(stderr=True, highlight=False)
    try:
        with open_store(db_url, read_only=True) as store:
            rollout_id = store.resolve("rollout", rollout_id)
        replayed = asyncio.run(
            replay_rollout(
                rollout_id,
                db=db_url,
                mode=mode,
                sandbox=sandbox,
                backends=backends,
                engine_model=engine_model,
                allow_task_change=allow_task_change,
                say=lambda line: err.print(escape(line)),
            )
        )
    except _CANNOT as e:
        err.print(f"Error: {escape(str(e))}")
        sys.exit(FAILED)
    if as_json:
        click.echo(json.dumps(replayed.report.to_json(), ensure_ascii=False))
    else:
        render(console, replayed.report)
    sys.exit(exit_status(replayed))


def exit_status(replayed: Replayed) -> int:
    if replayed.infrastructure_failed:
        return FAILED
    return REPRODUCED if replayed.report.reproduced else DIVERGED


def render(console: Console, report: ReplayReport) -> None:
    console.print(
        f"[bold]replay {report.replay}[/bold] of rollout {report.original} ({report.mode.value})"
    )
    table = Table(box=None, header_style="bold")
    for column in ("call", "lane", "outcome", "served", "recorded seq", "what differs"):
        table.add_column(column)
    for c in report.calls:
        style = _STYLE[c.outcome]
        table.add_row(
            str(c.position),
            c.lane,
            f"[{style}]{c.outcome.value}[/{style}]",
            c.served.value,
            "-" if c.recorded_seq is None else str(c.recorded_seq),
            escape(c.divergence.summary) if c.divergence else "",
        )
    console.print(table)
    first = report.first_divergence
    if first is not None:
        _render_diff(console, first)
    for note in report.notes:
        console.print(f"note: {escape(note)}")
    rewards = f"reward {report.replayed_reward} (recorded {report.recorded_reward})"
    if report.reproduced:
        console.print(f"[green]reproduced[/green]: every call matched; {rewards}")
    elif first is None:
        console.print(f"[red]diverged[/red]: every call matched, but {rewards}")
    else:
        live = "" if report.live_from is None else f"; live from call {report.live_from}"
        console.print(f"[red]diverged[/red] at call {first.position}{live}; {rewards}")


def _render_diff(console: Console, call: CallReplay) -> None:
    divergence = call.divergence
    if divergence is None:
        what = "the harness made a call the record does not have"
        if call.outcome is Outcome.MISSING:
            what = f"recorded call {call.recorded_seq} was never made"
        console.print(f"call {call.position}: {what}")
        return
    console.print(f"[bold]call {call.position}[/bold] against recorded call {call.recorded_seq}:")
    if divergence.params:
        console.print(f"  fields that differ: {', '.join(divergence.params)}")
    for change in divergence.messages:
        console.print(f"  message {change.index} ({change.role}) {change.kind}")
        for line in change.diff:
            style = "red" if line.startswith("-") else "green" if line.startswith("+") else "dim"
            console.print(f"    [{style}]{escape(line)}[/{style}]")
