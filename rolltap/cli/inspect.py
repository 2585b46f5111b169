"""`rolltap ls` and `rolltap show`: what the store holds, for a person at a terminal."""

from __future__ import annotations

import json
import sys
from datetime import datetime
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from rolltap.cli.audit import render as render_integrity
from rolltap.cli.options import db_option
from rolltap.cli.trajectory_view import render_segments, tokenizer_option
from rolltap.store import CallView, EgressRecord, EgressVerdict, RolloutView, StoreReader
from rolltap.store import open as open_store
from rolltap.store.bridging import Bridging
from rolltap.store.detokenizer import HFDetokenizer
from rolltap.store.export import rollout_document


@click.command()
@db_option
@click.option("--batch", help="Only rollouts of this batch.")
@click.option("--status", help="Only rollouts with this status.")
@click.option("--limit", default=50, show_default=True, help="At most this many rollouts.")
@click.option(
    "--json", "as_json", is_flag=True, help="JSON Lines: one object per rollout (see README)."
)
def ls(
    db_url: str | None, batch: str | None, status: str | None, limit: int, as_json: bool
) -> None:
    """List rollouts, newest first."""
    with open_store(db_url, read_only=True) as store:
        rollouts = store.rollouts(batch=batch, status=status, limit=limit)
    if not rollouts:
        # On stderr: --json output stays valid (empty) JSON Lines.
        click.echo(_nothing_matches(batch, status), err=True)
        return
    if as_json:
        for r in rollouts:
            click.echo(json.dumps(r.as_dict(), ensure_ascii=False))
        return
    console = _console()
    table = Table(box=None, header_style="bold")
    for column in ("rollout", "created", "status", "reward", "calls", "tokens", "batch", "task"):
        numeric = column in ("reward", "calls", "tokens")
        table.add_column(column, justify="right" if numeric else "left", no_wrap=True)
    for r in rollouts:
        table.add_row(
            r.id,
            _time(r.created_at),
            r.status.value,
            "-" if r.reward is None else f"{r.reward:g}",
            str(r.n_calls),
            str(r.n_tokens),
            r.batch_id or "-",
            _task(r),
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
    "(see README).",
)
def show(db_url: str | None, rollout_id: str, tokenizer: Path | None, as_json: bool) -> None:
    """Show one rollout, its calls one line each, then its segments and where the chain broke."""
    detokenizer = None if tokenizer is None else HFDetokenizer.from_path(tokenizer)
    with open_store(db_url, read_only=True) as store:
        if as_json:
            document = store.run(rollout_document(store.store, rollout_id, detokenizer=detokenizer))
            click.echo(json.dumps(document, ensure_ascii=False))
            return
        rollout = store.rollout(rollout_id)
        calls = store.calls(rollout_id)
        console = _console()
        _render(console, store, rollout, calls)
        # Its hash chain, and the calls the proxy refused (budget, finished, revoked, malformed).
        render_integrity(console, store.verify_rollout(rollout_id))
        _render_egress(console, store.egress(rollout_id))
        if calls:
            render_segments(
                console, store.rollout_trajectories(rollout_id, detokenizer=detokenizer)
            )


def _render_egress(console: Console, records: list[EgressRecord]) -> None:
    """What the sandbox sent out through the egress gate (nothing without `--egress`)."""
    if not records:
        return
    denied = sum(r.verdict is EgressVerdict.DENIED for r in records)
    console.print(f"[bold]egress[/bold]  {len(records)} requests, {denied} denied")
    table = Table(box=None, header_style="bold")
    for column in ("time", "verdict", "http", "method", "host", "path", "sent", "got", "reason"):
        table.add_column(column, overflow="fold")
    colour = {EgressVerdict.DENIED: "red", EgressVerdict.INTERCEPTED: "cyan"}
    for r in records:
        verdict = r.verdict.value
        if r.verdict in colour:
            verdict = f"[{colour[r.verdict]}]{verdict}[/{colour[r.verdict]}]"
        table.add_row(
            r.at.strftime("%H:%M:%S.%f")[:-3],
            verdict,
            str(r.status or "-"),
            r.method,
            r.host,
            r.path[:60],
            str(r.request_bytes),
            str(r.response_bytes),
            "" if r.verdict is EgressVerdict.ALLOWED else r.reason[:80],
        )
    console.print(table)


def _render(console: Console, store: StoreReader, r: RolloutView, calls: list[CallView]) -> None:
    console.print(f"[bold]rollout {r.id}[/bold]  {r.status.value}  reward {r.reward}")
    console.print(
        f"  task {_task(r)}  batch {r.batch_id or '-'}  harness {r.harness or '-'}  "
        f"model {r.model or '-'}  created {_time(r.created_at)}"
    )
    if r.error:
        console.print(f"  [red]error[/red] {r.error}")
    bridging = Bridging.of(c.bridge for c in calls)
    if bridging is not None:
        rate = bridging.bridge_break_rate
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(bridging.outcomes.items()))
        console.print(
            f"  token-in  bridge_break_rate {'-' if rate is None else f'{rate:.2f}'}  ({outcomes})"
        )
    table = Table(box=None, header_style="bold")
    for column in (
        "seq",
        "dialect",
        "status",
        "http",
        "prompt",
        "completion",
        "n",
        "finish",
        "ttft ms",
        "total ms",
        "capture",
        "backend",
        "note",
    ):
        table.add_column(column)
    for c in calls:
        bridge = c.bridge and f"token-in {c.bridge}"
        notes = [
            x for x in (c.purpose, bridge, c.retry_of and f"retry of {c.retry_of}", c.error) if x
        ]
        table.add_row(
            str(c.seq),
            c.dialect.value + (" (stream)" if c.stream else ""),
            c.status.value,
            str(c.http_status or "-"),
            str(c.prompt_tokens),
            str(c.completion_tokens),
            str(c.n_choices),
            c.finish_reason or "-",
            _ms(c.received_at, c.first_token_at),
            _ms(c.received_at, c.finished_at),
            c.capture.value,
            c.backend or "-",
            "; ".join(notes)[:80],
        )
    console.print(table)


def _nothing_matches(batch: str | None, status: str | None) -> str:
    filters = [f"--{k} {v}" for k, v in (("batch", batch), ("status", status)) if v is not None]
    return f"no rollouts match {' '.join(filters)}" if filters else "no rollouts yet"


def _console() -> Console:
    # Piped output is for grep and people's logs: do not squeeze it into 80 columns.
    return Console() if sys.stdout.isatty() else Console(width=220)


def _task(r: RolloutView) -> str:
    if r.task_id is None:
        return "-"
    return r.task_id if r.sample_index is None else f"{r.task_id}#{r.sample_index}"


def _time(t: datetime) -> str:
    return t.astimezone().strftime("%Y-%m-%d %H:%M:%S")


def _ms(start: datetime, end: datetime | None) -> str:
    return "-" if end is None else f"{(end - start).total_seconds() * 1000:.0f}"
