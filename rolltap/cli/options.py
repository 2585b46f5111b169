"""Options shared by several commands: flag, then ROLLTAP_* environment variable, then default."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path
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


def engine_arg_option(f: F) -> F:
    return click.option(
        "--engine-arg",
        "engine_args",
        multiple=True,
        metavar="ARG",
        help="Built-in engine: a flag of `rolltap model serve` (repeatable), after rolltap's "
        "defaults for it (--default-max-tokens=256 --max-tokens-cap=512), so it overrides them: "
        "--engine-arg=--max-tokens-cap=2048.",
    )(f)


def max_tokens_cap_option(f: F) -> F:
    return click.option(
        "--max-tokens-cap",
        type=click.IntRange(min=1),
        envvar="ROLLTAP_MAX_TOKENS_CAP",
        help="The proxy lowers any call's max_tokens to this (recorded on the call), "
        "whatever the backend.",
    )(f)


def checked_backends(values: tuple[str, ...]) -> list[str]:
    """--backend values (each may hold several, space-separated, as ROLLTAP_BACKENDS does),
    refused with one line before anything starts when one is not `[KIND=]URL`."""
    from rolltap.proxy.backends import parse_backend

    specs = [spec for value in values for spec in value.split()]
    for spec in specs:
        try:
            parse_backend(spec)
        except ValueError as e:
            raise click.ClickException(f"--backend {spec}: {e}") from None
    return specs


def check_port(host: str, port: int) -> None:
    """Refuse a port something else listens on with one line, before anything starts."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        family, kind, proto, _, address = infos[0]
        with socket.socket(family, kind, proto) as probe:
            # As aiohttp binds (reuse_address): a port in TIME_WAIT is free to it.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as e:
        raise click.ClickException(
            f"cannot listen on {host}:{port}: {e.strerror or e} (choose another with --port)"
        ) from None


def tokenizer_option(f: F) -> F:
    return click.option(
        "--tokenizer",
        type=click.Path(exists=True, path_type=Path),
        help="A local tokenizer folder or .gguf file: drift is then also judged on decoded "
        "text, and breaks show it.",
    )(f)
