"""`rolltap export`: the store's trajectories to a Parquet or JSON-lines file for a trainer."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from rolltap.cli.options import db_option
from rolltap.cli.trajectory_view import tokenizer_option
from rolltap.store import open as open_store
from rolltap.store.detokenizer import HFDetokenizer
from rolltap.store.export import open_writer, write_all

_SUFFIX = {"parquet": ".parquet", "jsonl": ".jsonl"}


@click.command()
@db_option
@click.option("--batch", help="Only rollouts of this batch.")
@click.option("--status", help="Only rollouts with this status (e.g. succeeded).")
@click.option("--rollout", "rollouts", multiple=True, help="Only this rollout (repeatable).")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["parquet", "jsonl"]),
    help="Output format. Default: from the --out suffix, else parquet.",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Output file. Default: trajectories.parquet (or .jsonl) here.",
)
@tokenizer_option
def export(
    db_url: str | None,
    batch: str | None,
    status: str | None,
    rollouts: tuple[str, ...],
    fmt: str | None,
    out: Path | None,
    tokenizer: Path | None,
) -> None:
    """Write every segment of the selected rollouts as one trajectory row (prompt_ids,
    response_ids, loss_mask, logprobs, reward, links and drift)."""
    if fmt is None:
        fmt = "jsonl" if out is not None and out.suffix == ".jsonl" else "parquet"
    out = out or Path("trajectories" + _SUFFIX[fmt])
    detokenizer = None if tokenizer is None else HFDetokenizer.from_path(tokenizer)
    console = Console(stderr=True)
    selected = list(rollouts) or None
    with open_store(db_url) as store:
        total = len(store.rollouts(batch=batch, status=status, ids=selected))
        writer = open_writer(fmt, out)
        try:
            with Progress(
                TextColumn("exporting"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("rollouts"),
                TimeRemainingColumn(),
                console=console,
                disable=not console.is_terminal,
            ) as progress:
                task = progress.add_task("export", total=total)
                stats = write_all(
                    store.iter_rollout_trajectories(
                        batch=batch, rollouts=selected, status=status, detokenizer=detokenizer
                    ),
                    writer,
                    on_rollout=lambda _: progress.advance(task),
                )
        finally:
            writer.close()
    click.echo(
        f"wrote {stats.trajectories} trajectories ({stats.tokens} tokens, "
        f"{stats.sampled_tokens} sampled) from {stats.rollouts} rollouts to {out}"
    )
