"""`rolltap export`: the store's trajectories to a Parquet or JSON-lines file for a trainer, or to
Harbor's ATIF trajectory.json per rollout; `--sign` adds an HMAC-signed manifest beside it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from ..analysis.detokenizer import HFDetokenizer
from ..analysis.reader import iter_rollout_trajectories
from ..analysis.trajectory import replay_of
from ..audit.integrity import verify_rollout
from ..audit.signature import sign
from ..export.atif import rollout_atif
from ..export.export import open_writer, write_all
from ..store import RolloutStatus, RolloutView, StoreReader, Verdict
from ..store import open as open_store
from .ids import batch_filter
from .options import db_option, tokenizer_option
from .signing import secret_option, signing_key

_SUFFIX = {"parquet": ".parquet", "jsonl": ".jsonl", "atif": ".json"}
_DEFAULT_OUT = {"parquet": "trajectories.parquet", "jsonl": "trajectories.jsonl"}


def _format_and_out(fmt: str | None, out: Path | None) -> tuple[str, Path]:
    """The format (given, else from --out's suffix) and the output path, refusing a suffix that
    names another format and a path under a file before anything is read."""
    by_suffix = {suffix: name for name, suffix in _SUFFIX.items()}
    suffix = out.suffix if out is not None else ""
    if fmt is None:
        if suffix and suffix not in by_suffix:
            raise click.ClickException(
                f"--out {out}: rolltap writes {', '.join(by_suffix)} (or an ATIF directory); "
                "give one of those suffixes or --format"
            )
        fmt = by_suffix.get(suffix, "parquet")
    elif suffix and suffix != _SUFFIX[fmt]:
        raise click.ClickException(f"--out {out} does not end in {_SUFFIX[fmt]} (--format {fmt})")
    out = out or Path(_DEFAULT_OUT.get(fmt, "trajectories-atif"))
    # Missing folders are made only when the export writes (_make_parent); a file in the way
    # can never become one, so that is refused now rather than after reading the store.
    # os.path.exists, not Path.exists: a folder we may not look into is passed over rather
    # than raised, and then the mkdir names it.
    existing = next(p for p in out.absolute().parents if os.path.exists(p))
    if not existing.is_dir():
        raise click.ClickException(f"--out {out}: {existing} is not a directory")
    return fmt, out


def _make_parent(path: Path) -> None:
    """The folders `path` goes in, made just before it is written, so that an export refused
    (no rollouts match, a chain that does not verify) leaves nothing behind."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise click.ClickException(f"--out {path}: cannot make {path.parent}: {e.strerror}") from e


def _filters(batch: str | None, status: str | None, rollouts: tuple[str, ...]) -> str:
    given = [("--batch", batch), ("--status", status), *(("--rollout", r) for r in rollouts)]
    named = " ".join(f"{flag} {value}" for flag, value in given if value is not None)
    return named or "(the store holds none)"


@click.command()
@db_option
@click.option("--batch", help="Only rollouts of this batch.")
@click.option("--status", help="Only rollouts with this status (e.g. finished).")
@click.option("--rollout", "rollouts", multiple=True, help="Only this rollout (repeatable).")
@click.option(
    "--all",
    "everything",
    is_flag=True,
    help="Every selected rollout. Default: only what a trainer takes as it comes, rollouts "
    "that ended with the verifier's reward (finished, timed_out, budget_exceeded) and are not "
    "replays of another; --status or --rollout pick explicitly.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["parquet", "jsonl", "atif"]),
    help="Output format. Default: from the --out suffix (.jsonl, .json for ATIF), else parquet. "
    "atif: Harbor's trajectory.json per rollout.",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    help="Output file (ATIF: a directory of ROLLOUT/trajectory.json, or a .json file for one "
    "rollout). Default: trajectories.parquet (.jsonl; trajectories-atif/) here.",
)
@click.option(
    "--sign",
    "sign_export",
    is_flag=True,
    help="Write OUT.sig: the export's files, each rollout's hash-chain head, under an HMAC with "
    "the proxy's secret (`rolltap audit verify --export OUT` checks it).",
)
@secret_option
@tokenizer_option
def export(
    db_url: str | None,
    batch: str | None,
    status: str | None,
    rollouts: tuple[str, ...],
    everything: bool,
    fmt: str | None,
    out: Path | None,
    sign_export: bool,
    secret: str | None,
    tokenizer: Path | None,
) -> None:
    """Write every segment of the selected rollouts as one trajectory row (prompt_ids,
    response_ids, loss_mask, logprobs, reward, links and drift), or each rollout as an ATIF
    trajectory."""
    fmt, out = _format_and_out(fmt, out)
    with open_store(db_url, read_only=True) as store:
        batch = batch_filter(store, batch)
        selected = [store.resolve("rollout", r) for r in rollouts] or None
        views = store.rollouts(batch=batch, status=status, ids=selected, oldest_first=True)
        if not views:
            raise click.ClickException(f"no rollouts match {_filters(batch, status, rollouts)}")
        if not (everything or status or selected):
            views, left_out = _trainable(views)
            if not views:
                raise click.ClickException(
                    f"none of the {left_out} rollouts matching {_filters(batch, status, rollouts)} "
                    "ended with a reward (or they are replays): --all exports them anyway"
                )
            if left_out:
                click.echo(
                    f"left out {left_out} rollouts that did not end with a reward or are "
                    "replays (--all exports them too)",
                    err=True,
                )
        if sign_export:
            # Sign only what verifies: a signature must never vouch for an altered record.
            key = signing_key(db_url, secret, create=True)
            chains = _verified_chains(store, views)
        if fmt == "atif":
            _export_atif(store, views, out)
        else:
            _export_rows(store, fmt, out, [v.id for v in views], tokenizer)
    if sign_export:
        click.echo(f"signed: {sign(out, fmt, views, chains, key)}")


_TRAINABLE = frozenset(
    {RolloutStatus.FINISHED, RolloutStatus.TIMED_OUT, RolloutStatus.BUDGET_EXCEEDED}
)
"""Statuses whose rollouts the verifier rewarded (docs/training.md)."""


def _trainable(views: list[RolloutView]) -> tuple[list[RolloutView], int]:
    """The rollouts a trainer takes as they come (a reward, not a replay), and how many not."""
    kept = [
        v
        for v in views
        if v.status in _TRAINABLE
        and v.verdict is not Verdict.UNVERIFIED
        and replay_of(v.meta) is None
    ]
    return kept, len(views) - len(kept)


def _export_rows(
    store: StoreReader,
    fmt: str,
    out: Path,
    selected: list[str],
    tokenizer: Path | None,
) -> None:
    detokenizer = None if tokenizer is None else HFDetokenizer.from_path(tokenizer)
    console = Console(stderr=True)
    total = len(selected)
    _make_parent(out)
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
                iter_rollout_trajectories(store, rollouts=selected, detokenizer=detokenizer),
                writer,
                on_rollout=lambda _: progress.advance(task),
            )
    finally:
        writer.close()
    click.echo(
        f"wrote {stats.trajectories} trajectories ({stats.tokens} tokens, "
        f"{stats.sampled_tokens} sampled) from {stats.rollouts} rollouts to {out}"
    )


def _export_atif(store: StoreReader, views: list[RolloutView], out: Path) -> None:
    one_file = out.suffix == ".json"
    if one_file and len(views) != 1:
        raise click.UsageError(
            f"--out {out} names one file, but {len(views)} rollouts are selected: "
            "give --rollout ID, or a directory"
        )
    if not one_file:
        out.mkdir(parents=True, exist_ok=True)
    written, steps, empty = 0, 0, []
    for view in views:
        document = store.run(rollout_atif(store.store, view.id))
        if document is None:
            empty.append(view.id)
            continue
        path = out if one_file else out / view.id / "trajectory.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n")
        written += 1
        steps += len(document["steps"])
    click.echo(f"wrote {written} ATIF trajectories ({steps} steps) to {out}")
    if empty:
        click.echo(f"skipped {len(empty)} rollouts with no LLM call to show: {', '.join(empty)}")


def _verified_chains(store: StoreReader, views: list[RolloutView]) -> dict[str, str | None]:
    """Each rollout's current chain end, refusing to go on when any chain does not verify."""
    chains: dict[str, str | None] = {}
    broken = []
    for view in views:
        result = store.run(verify_rollout(store.store, view.id))
        if not result.ok:
            broken.append(f"{view.id} ({len(result.issues)} issues)")
        chains[view.id] = result.chain_hash
    if broken:
        raise click.ClickException(
            "not signing: these rollouts do not verify (see `rolltap audit verify`): "
            + ", ".join(broken)
        )
    return chains
