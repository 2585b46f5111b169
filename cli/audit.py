"""`rolltap audit verify`: recompute rollouts' hash chains and say what was altered, and where,
and which weights served their calls; check a signed export against its signature and the
store. `rolltap audit hacks`: run the reward-hack detectors over what the store recorded and
name each flagged call. `rolltap audit weights OLD NEW`: compare two weight versions' stored
checksums parameter by parameter."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape

from ..analysis.choice import DetectorError, load_detectors
from ..analysis.hack_check import check_hacks
from ..analysis.hacks import HackFlag, flags_of
from ..audit import signature
from ..audit.integrity import RolloutIntegrity, verify_rollout
from ..store import NotFound, StoreReader
from ..store import open as open_store
from ..store.weights import compare
from .ids import batch_filter
from .options import db_option
from .signing import secret_option, signing_key


@click.group()
def audit() -> None:
    """Check what the store holds against its hash chains."""


@audit.command()
@db_option
@click.argument("rollout_id", required=False)
@click.option("--batch", help="Every rollout of this batch.")
@click.option(
    "--export",
    "export_path",
    type=click.Path(path_type=Path),
    help="Check a signed export (the file or directory, or its .sig): its signature, its files, "
    "and each of its rollouts against this store's chains.",
)
@click.option("--all", "every", is_flag=True, help="Every rollout in the store.")
@click.option(
    "--json", "as_json", is_flag=True, help="One JSON object per rollout (JSON Lines) on stdout."
)
@secret_option
def verify(
    db_url: str | None,
    rollout_id: str | None,
    batch: str | None,
    export_path: Path | None,
    every: bool,
    as_json: bool,
    secret: str | None,
) -> None:
    """Recompute each call's digest and link and the rollout's sealed head; list every altered,
    missing or reordered call, and the calls the proxy refused. Exit status 1 when anything
    does not hold. ROLLOUT may be a unique prefix of its id."""
    if sum(x is not None for x in (rollout_id, batch, export_path)) + every != 1:
        raise _Unclear(
            "verify what? give one of: a ROLLOUT id, --batch NAME, --export FILE, or --all "
            "(every rollout in the store)"
        )
    console = Console(width=None if sys.stdout.isatty() else 200, highlight=False)
    if export_path is not None:
        try:
            export, manifest = signature.read(export_path)
        except signature.BadManifest as e:
            raise click.ClickException(str(e)) from e
        checked = signature.check(export, manifest, signing_key(db_url, secret, create=False))
        if not _verify_export(console, db_url, checked):
            sys.exit(1)
        return
    failed = 0
    with open_store(db_url, read_only=True) as store:
        ids = (
            [store.resolve("rollout", rollout_id)]
            if rollout_id is not None
            else [r.id for r in store.rollouts(batch=batch_filter(store, batch), oldest_first=True)]
        )
        if not ids:
            raise click.ClickException(
                "the store holds no rollouts yet" if every else f"batch {batch!r} has no rollouts"
            )
        for rid in ids:
            result = store.run(verify_rollout(store.store, rid))
            failed += not result.ok
            if as_json:
                click.echo(json.dumps(result.as_dict()))
            else:
                render(console, result)
    if not as_json and len(ids) > 1:
        console.print(f"{len(ids)} rollouts: {len(ids) - failed} intact, {failed} with issues")
    if failed:
        sys.exit(1)


@audit.command()
@db_option
@click.argument("old")
@click.argument("new")
@click.option("--json", "as_json", is_flag=True, help="The comparison as one JSON object.")
@click.option("--show", default=20, show_default=True, help="Changed parameters to name.")
def weights(db_url: str | None, old: str, new: str, as_json: bool, show: int) -> None:
    """Compare the weights of versions OLD and NEW by the checksums their engines reported at
    the commits that put them in (vLLM's /weight_checker, SGLang's /weights_checker): which
    parameters changed, appeared or went. Exit status 1 when none changed."""
    with open_store(db_url, read_only=True) as store:
        found = {v: store.run(store.store.weight_checksums(v)) for v in (old, new)}
    for version, rows in found.items():
        if not rows:
            raise click.ClickException(
                f"no checksums stored for weight version {version!r}: its engines offered none, "
                "or no commit put it in"
            )
    diff = compare(found[old][0], found[new][0])
    if as_json:
        click.echo(json.dumps(diff.as_dict()))
    else:
        click.echo(
            f"{old} -> {new}: {len(diff.changed)} changed, {len(diff.added)} added, "
            f"{len(diff.removed)} removed, {diff.same} the same"
        )
        for name in diff.changed[:show]:
            click.echo(f"  changed  {name}")
        if len(diff.changed) > show:
            click.echo(f"  ... and {len(diff.changed) - show} more")
        for name in diff.added:
            click.echo(f"  added    {name}")
        for name in diff.removed:
            click.echo(f"  removed  {name}")
    if not (diff.changed or diff.added or diff.removed):
        sys.exit(1)


@audit.command()
@db_option
@click.argument("rollout_id", required=False)
@click.option("--batch", help="Every rollout of this batch.")
@click.option("--all", "every", is_flag=True, help="Every rollout in the store.")
@click.option(
    "--detector",
    "detectors",
    multiple=True,
    metavar="NAME|MODULE:ATTR",
    help="Run only these built-ins (repeat), add a detector of yours by dotted path, or leave "
    "one out with -NAME. Default: the built-ins and installed rolltap.detectors entry points.",
)
@click.option(
    "--stored",
    is_flag=True,
    help="Show the flags stored when each rollout finished instead of running the detectors.",
)
@click.option(
    "--save",
    is_flag=True,
    help="Store the flags found as each rollout's hack_flags (sealed into an ended one's head).",
)
@click.option(
    "--json", "as_json", is_flag=True, help="One JSON object per rollout (JSON Lines) on stdout."
)
def hacks(
    db_url: str | None,
    rollout_id: str | None,
    batch: str | None,
    every: bool,
    detectors: tuple[str, ...],
    stored: bool,
    save: bool,
    as_json: bool,
) -> None:
    """Run the reward-hack detectors over each rollout's recorded tool calls, tool results and
    egress (analysis/detectors.py), and list every flag with the call and the command that raised
    it. Exit status 1 when any rollout is flagged. ROLLOUT may be a unique prefix of its id."""
    if sum(x is not None for x in (rollout_id, batch)) + every != 1:
        raise _Unclear("audit which rollouts? give one of: a ROLLOUT id, --batch NAME, or --all")
    if stored and (save or detectors):
        raise _Unclear("--stored shows what is stored: it takes no --detector or --save")
    try:
        chosen = load_detectors(list(detectors))
    except DetectorError as e:
        raise click.ClickException(str(e)) from e
    console = Console(width=None if sys.stdout.isatty() else 200, highlight=False)
    flagged = 0
    by_detector: dict[str, int] = {}
    with open_store(db_url, read_only=not save) as store:
        views = (
            [store.rollout(store.resolve("rollout", rollout_id))]
            if rollout_id is not None
            else store.rollouts(batch=batch_filter(store, batch), oldest_first=True)
        )
        if not views:
            raise click.ClickException(
                "the store holds no rollouts yet" if every else f"batch {batch!r} has no rollouts"
            )
        for view in views:
            kept = flags_of(view.hack_flags)
            if stored:
                found = kept or []
            else:
                found = store.run(check_hacks(store.store, view.id, chosen, save=save))
            flagged += bool(found)
            for detector in {f.detector for f in found}:
                by_detector[detector] = by_detector.get(detector, 0) + 1
            if as_json:
                row = {
                    "rollout_id": view.id,
                    "batch_id": view.batch_id,
                    "task_id": view.task_id,
                    "status": view.status.value,
                    "reward": view.reward,
                    "flags": [f.as_dict() for f in found],
                    "stored": None if kept is None else [f.as_dict() for f in kept],
                }
                click.echo(json.dumps(row))
            elif found:
                _render_flags(console, view.id, view.task_id, view.reward, found, kept, stored)
    if not as_json:
        counts = ", ".join(f"{d} {n}" for d, n in sorted(by_detector.items())) or "none"
        console.print(
            f"{len(views)} rollout{'s' * (len(views) != 1)}: {flagged} flagged ({counts}), "
            f"{len(views) - flagged} clean"
        )
    if flagged:
        sys.exit(1)


def _render_flags(
    console: Console,
    rollout_id: str,
    task_id: str | None,
    reward: float | None,
    found: list[HackFlag],
    kept: list[HackFlag] | None,
    stored: bool,
) -> None:
    note = ""
    if not stored and kept is not None and kept != found:
        note = f"  [yellow](stored when it finished: {len(kept)} flags)[/yellow]"
    console.print(
        f"rollout {rollout_id}  task {escape(task_id or '-')}  reward {reward}  "
        f"[red bold]{len(found)} flag{'s' * (len(found) != 1)}[/red bold]{note}"
    )
    for f in found:
        where = f"seq {f.seq} call {f.call_id}" if f.call_id else f.source
        console.print(f"  [red]{f.detector:>14}[/red]  {where}  {escape(f.reason)}")
        if f.command:
            console.print(f"  {'':>14}  [dim]{escape(f.command)}[/dim]")


class _Unclear(click.ClickException):
    """A usage error, in one line."""

    exit_code = 2


def _verify_export(console: Console, db_url: str | None, checked: signature.SignatureCheck) -> bool:
    manifest = checked.manifest
    about = manifest.get("export", {})
    state = "[green]valid[/green]" if checked.signed else "[red bold]INVALID[/red bold]"
    console.print(
        f"export {about.get('name')} ({about.get('format')}, {len(manifest.get('files', []))} "
        f"files, {len(manifest.get('rollouts', []))} rollouts, signed {manifest.get('created_at')})"
        f"  signature {state}"
    )
    problems = list(checked.problems)
    with open_store(db_url, read_only=True) as store:
        for entry in manifest.get("rollouts", []):
            problems += _against_store(console, store, entry)
    for problem in problems:
        console.print(f"  [red]{escape(problem)}[/red]")
    verdict = "[green]the export is what was signed[/green]"
    if problems:
        verdict = f"[red bold]{len(problems)} problem(s)[/red bold]"
    console.print(verdict)
    return not problems


def _against_store(console: Console, store: StoreReader, entry: dict[str, Any]) -> list[str]:
    """The store's record of an exported rollout against what the export says it was."""
    rid = str(entry.get("id"))
    try:
        result = store.run(verify_rollout(store.store, rid))
    except NotFound:
        console.print(f"  rollout {rid}: not in this store (only the signature was checked)")
        return []
    problems = [f"rollout {rid}: {issue.message}" for issue in result.issues]
    n = int(entry.get("calls") or 0)
    calls = store.calls(rid)
    at = next((c for c in calls if c.seq == n), None)
    now = at.hash if at is not None else (None if n else entry.get("chain_hash"))
    if now != entry.get("chain_hash"):
        problems.append(f"rollout {rid}: its first {n} calls are not the ones exported")
    if entry.get("head_hash") is not None and result.head_hash != entry.get("head_hash"):
        problems.append(f"rollout {rid}: its sealed head differs from the exported one")
    if not problems:
        console.print(f"  rollout {rid}: matches the store ({n} calls)")
    return problems


def render(console: Console, result: RolloutIntegrity) -> None:
    """A rollout's integrity in a few lines: its verdict, then each issue and refused call."""
    if result.ok:
        verdict = "[green]intact[/green]"
    else:
        n = len(result.issues)
        verdict = f"[red bold]NOT INTACT[/red bold] ({n} issue{'s' * (n != 1)})"
    if result.sealed:
        seal = f"sealed at seq {result.head_seq}, head {(result.head_hash or '')[:16]}"
        if result.after_head:
            seal += f", {result.after_head} call(s) after the end"
    else:
        seal = "not sealed yet (still running)"
    console.print(
        f"rollout {result.rollout_id}  {result.status.value}  {result.calls} calls  {seal}  "
        + verdict
    )
    for served in result.weights:
        digest = "no checksums offered" if served.digest is None else served.digest[:16]
        console.print(
            f"  {'weights':>9}  version {escape(repr(served.weight_version))}: {served.calls} "
            f"call(s), weights {digest}, checksums of {served.engines} engine(s) stored"
        )
    for issue in result.issues:
        console.print(f"  [red]{issue.kind.value:>9}[/red]  {escape(issue.message)}")
    for refused in result.refused:
        why = escape(refused.error or "")
        console.print(
            f"  [yellow]  refused[/yellow]  seq {refused.seq} ({refused.http_status}) {why}"
        )
