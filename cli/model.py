"""`rolltap model ...`: the built-in model backend."""

from __future__ import annotations

import click

from ..engine.command import serve


@click.group()
def model() -> None:
    """The built-in model backend (transformers + torch, vLLM's wire format)."""


model.add_command(serve)
