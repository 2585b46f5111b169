"""`rolltap harness ...`: install and inspect agent harnesses."""

from __future__ import annotations

import click


@click.group()
def harness() -> None:
    """Agent harnesses rolltap can run unmodified."""
