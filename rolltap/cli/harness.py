"""`rolltap harness ...`: install and inspect agent harnesses."""

from __future__ import annotations

from collections.abc import Callable

import click

from rolltap.runner.harnesses import HarnessError, adapter, adapters, harness_root, install
from rolltap.runner.harnesses.install import read_record


@click.group()
def harness() -> None:
    """Agent harnesses rolltap can run unmodified."""


@harness.command("install")
@click.argument("names", nargs=-1, required=True, metavar="NAME...")
@click.option("--force", is_flag=True, help="Reinstall even when an install is present.")
def install_command(names: tuple[str, ...], force: bool) -> None:
    """Install harnesses into isolated prefixes under the harness directory.

    The directory is $ROLLTAP_HARNESS_DIR, else rolltap/harnesses in your user data directory.
    """
    root = harness_root()
    try:
        chosen = [adapter(n) for n in names]
        for h in chosen:
            record = install(h, root, force=force, say=_prefixed(h.name))
            click.echo(
                f"{h.name}: installed at {record.prefix} "
                f"({record.size_bytes / 1e6:.0f} MB, {record.seconds:.1f} s)"
            )
    except HarnessError as e:
        raise click.ClickException(str(e)) from e


def _prefixed(name: str) -> Callable[[str], None]:
    return lambda message: click.echo(f"{name}: {message}")


@harness.command("list")
def list_command() -> None:
    """Show every harness, whether it is installed, and where."""
    root = harness_root()
    click.echo(f"harness directory: {root}")
    for name, h in adapters().items():
        record = read_record(name, root)
        if record is None:
            state, where = "not installed", ""
        elif not record.is_current(h):
            state, where = "outdated", record.prefix
        else:
            state, where = f"installed {record.size_bytes / 1e6:.0f} MB", record.bin_dir
        click.echo(f"{name:<16} {h.dialect:<10} {state:<18} {where}")
        if record is not None and len(record.mounts) > 1:
            click.echo(f"{'':<16} also mounts: {' '.join(record.mounts[1:])}")
