"""`rolltap egress install`: the mitmproxy environment `rolltap run --egress` needs."""

from __future__ import annotations

import click

from ..runner.egress import install_egress


@click.group()
def egress() -> None:
    """Controlled egress for sandboxes (rolltap run --egress allowlist|intercept)."""


@egress.command("install")
@click.option("--force", is_flag=True, help="Reinstall even when an install is present.")
def install_command(force: bool) -> None:
    """Install mitmproxy into a venv of its own (it pins libraries rolltap's outgrew)."""
    python = install_egress(force=force, say=click.echo)
    click.echo(f"egress gate ready: {python}")
