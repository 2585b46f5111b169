"""The proxy's secret as the key of signed exports, for `rolltap export --sign` and `rolltap audit
verify --export`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from ..proxy.secret import export_key, secret_path
from ..store.url import resolve_url

F = TypeVar("F", bound=Callable[..., Any])


def secret_option(f: F) -> F:
    return click.option(
        "--secret",
        envvar="ROLLTAP_SECRET",
        show_envvar=True,
        help="The proxy's secret (as given to `rolltap serve --secret`); default: the one kept "
        "beside the SQLite database, or in your data directory for PostgreSQL.",
    )(f)


def signing_key(db_url: str | None, secret: str | None, *, create: bool) -> bytes:
    """The export key, or one clear line when checking and no secret exists to check with."""
    url = resolve_url(db_url)
    key = export_key(secret, url, create=create)
    if key is None:
        raise click.ClickException(
            f"no proxy secret at {secret_path(url)}: pass --secret (or ROLLTAP_SECRET) with the "
            "secret of the proxy that signed the export"
        )
    return key
