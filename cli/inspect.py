"""`rolltap ls` and `rolltap show`: what the store holds, for a person at a terminal.

What a command needs is imported when it runs (a listing never loads the proxy or aiohttp)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from .ids import batch_filter
from .options import db_option, tokenizer_option

if TYPE_CHECKING:
    from ..analysis.detokenizer import HFDetokenizer
    from ..store import BatchView


@click.command()
@db_option
@click.option("--batch", help="Only rollouts of this batch.")
@click.option("--status", help="Only rollouts with this status.")
@click.option("--limit", default=50, show_default=True, help="At most this many rows.")
@click.option(
    "--batches",
    "list_batches",
    is_flag=True,
    help="List batches instead: rollouts by status, mean reward, passed; newest first.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="JSON Lines: one object per rollout or batch (see docs/using.md).",
)
def ls(
    db_url: str | None,
    batch: str | None,
    status: str | None,
    limit: int,
    list_batches: bool,
    as_json: bool,
) -> None:
    """List rollouts (or, with --batches, batches), newest first."""
    from ..store.text_reader import open_listing

    if list_batches and (batch is not None or status is not None):
        raise click.ClickException(
            "--batches lists every batch: --batch and --status pick rollouts"
        )
    with open_listing(db_url) as store:
        if list_batches:
            _list_batches(store.batches(limit=limit), as_json)
            return
        batch = batch_filter(store, batch)
        rollouts = store.rollouts(batch=batch, status=status, limit=limit)
    if not rollouts:
        # On stderr: --json output stays valid (empty) JSON Lines.
        click.echo(_nothing_matches(batch, status), err=True)
        return
    if as_json:
        for r in rollouts:
            click.echo(json.dumps(r.as_dict(), ensure_ascii=False))
        return
    from rich.table import Table

    from .cells import task_label, when
    from .console import console_for_output

    console = console_for_output()
    table = Table(box=None, header_style="bold")
    columns = ("rollout", "created", "status", "reward", "verdict", "calls", "tokens", "batch")
    for column in (*columns, "task"):
        numeric = column in ("reward", "calls", "tokens")
        table.add_column(column, justify="right" if numeric else "left", no_wrap=True)
    for r in rollouts:
        table.add_row(
            r.id,
            when(r.created_at),
            r.status.value,
            "-" if r.reward is None else f"{r.reward:g}",
            r.verdict.value,
            str(r.n_calls),
            str(r.n_tokens),
            r.batch_id or "-",
            task_label(r),
        )
    console.print(table)


@click.command()
@db_option
@click.argument("rollout_id")
@tokenizer_option
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="One JSON document: rollout, calls, integrity, bridging, faithfulness, segments "
    "(see docs/using.md).",
)
@click.option(
    "--conversation",
    is_flag=True,
    help="Also print each call's new messages and the answer, as text (from the stored bodies).",
)
def show(
    db_url: str | None, rollout_id: str, tokenizer: Path | None, as_json: bool, conversation: bool
) -> None:
    """Show one rollout: its outcome (and why), its calls one line each, then its segments and
    where the chain broke."""
    from ..store import open as open_store
    from . import rollout_view

    detokenizer: HFDetokenizer | None = None
    if tokenizer is not None:
        from ..analysis.detokenizer import HFDetokenizer  # with aiohttp, for its engine twin

        detokenizer = HFDetokenizer.from_path(tokenizer)
    with open_store(db_url, read_only=True) as store:
        rollout_id = store.resolve("rollout", rollout_id)
        if as_json:
            from ..export.export import rollout_document

            document = store.run(rollout_document(store.store, rollout_id, detokenizer=detokenizer))
            click.echo(json.dumps(document, ensure_ascii=False))
            return
        rollout_view.show(store, rollout_id, detokenizer, conversation=conversation)


def _list_batches(batches: list[BatchView], as_json: bool) -> None:
    if not batches:
        click.echo("no batches yet (`rolltap run` makes one)", err=True)
        return
    if as_json:
        for b in batches:
            row = dataclasses.asdict(b)
            for name in ("created_at", "finished_at"):  # ISO 8601, as `ls --json` writes them
                row[name] = row[name] and row[name].isoformat()
            click.echo(json.dumps(row, ensure_ascii=False))
        return
    from rich.table import Table

    from .cells import when
    from .console import console_for_output

    table = Table(box=None, header_style="bold")
    for column in ("batch", "started", "rollouts", "tasks", "mean reward", "passed", "statuses"):
        numeric = column in ("rollouts", "tasks", "mean reward", "passed")
        table.add_column(column, justify="right" if numeric else "left", no_wrap=True)
    for b in batches:
        table.add_row(
            b.batch_id,
            when(b.created_at),
            str(b.rollouts),
            str(b.tasks),
            "-" if b.mean_reward is None else f"{b.mean_reward:.3g}",
            f"{b.passed}/{b.rewarded}",
            " ".join(f"{name} {n}" for name, n in sorted(b.statuses.items())),
        )
    console_for_output().print(table)


def _nothing_matches(batch: str | None, status: str | None) -> str:
    filters = [f"--{k} {v}" for k, v in (("batch", batch), ("status", status)) if v is not None]
    return f"no rollouts match {' '.join(filters)}" if filters else "no rollouts yet"
