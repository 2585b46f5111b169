"""`rolltap ui`: the read-only web viewer of the store."""

from __future__ import annotations

import asyncio
from pathlib import Path

import click

from ..proxy.control.admin import ExposedWithoutToken
from ..store.url import resolve_url
from ..ui import RunningUI, UISettings, serve_until_stopped
from ..ui.auth import check_binding
from .options import check_port, db_option


@click.command()
@db_option
@click.option("--host", default="127.0.0.1", show_default=True, envvar="ROLLTAP_UI_HOST")
@click.option("--port", default=8200, show_default=True, envvar="ROLLTAP_UI_PORT")
@click.option(
    "--admin-token",
    envvar="ROLLTAP_ADMIN_TOKEN",
    help="Required by every page when set; required beyond loopback.",
)
@click.option(
    "--tokenizer",
    type=click.Path(exists=True, path_type=Path),
    help="A local tokenizer folder or .gguf file for token text (default: the built-in "
    "model's, for its rollouts); drift breaks are then also judged on text.",
)
def ui(
    db_url: str | None, host: str, port: int, admin_token: str | None, tokenizer: Path | None
) -> None:
    """Browse batches and rollouts in a browser (read-only: the store is never written)."""
    try:
        check_binding(host, admin_token)
    except ExposedWithoutToken as e:
        raise click.UsageError(str(e)) from e
    check_port(host, port)
    settings = UISettings(host=host, port=port, admin_token=admin_token, tokenizer=tokenizer)
    store_url = resolve_url(db_url)

    def ready(running: RunningUI) -> None:
        click.echo(f"rolltap ui on {running.url}  (store: {store_url.render()}, read-only)")
        if admin_token:
            click.echo(f"  open {running.url}/?token=<admin token> once in your browser")

    asyncio.run(serve_until_stopped(settings, db_url, ready))
