"""Options shared by several commands: flag, then ROLLTAP_* environment variable, then default."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


def db_option(f: F) -> F:
    return click.option(
        "--db",
        "db_url",
        envvar="ROLLTAP_DB",
        default=None,
        show_envvar=True,
        metavar="URL",
        help="Database URL (sqlite:///PATH or postgresql+asyncpg://...). "
        "Default: a SQLite file in your user data directory.",
    )(f)
