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


def builtin_adapter_args(
    ctx: click.Context, adapter: str, engine_model: str | None, builtin: bool
) -> tuple[str, ...]:
    """The engine flag for --adapter, checked before anything starts (one line if wrong).

    `default` left at its default applies to the default model only, and quietly to nothing when
    no built-in engine starts; given on the command line there, it is refused."""
    from ..engine.adapter import DEFAULT, NONE, resolve_adapter
    from ..engine.errors import ModelLoadError

    given = ctx.get_parameter_source("adapter") not in (None, click.core.ParameterSource.DEFAULT)
    if not builtin:
        if given and adapter.lower() != NONE:
            raise click.ClickException("--adapter: only for the built-in engine (no --backend)")
        return ()
    if adapter.lower() == DEFAULT and engine_model is not None and not given:
        return ()
    try:
        path = resolve_adapter(adapter)
    except ModelLoadError as e:
        raise click.ClickException(f"--adapter: {e}") from None
    return () if path is None else (f"--adapter={path}",)


def max_tokens_cap_option(f: F) -> F:
    return click.option(
        "--max-tokens-cap",
        type=click.IntRange(min=1),
        envvar="ROLLTAP_MAX_TOKENS_CAP",
        help="The proxy lowers any call's max_tokens to this (recorded on the call), "
        "whatever the backend.",
    )(f)


def capture_routed_experts_option(f: F) -> F:
    return click.option(
        "--capture-routed-experts",
        is_flag=True,
        help="Record the MoE experts each token was routed to (routing replay, R3) beside its "
        "ids: SGLang (asked per call) or vLLM started with --enable-return-routed-experts "
        "(non-streaming calls only). Refused on the built-in engine and openai=URL backends.",
    )(f)


def refuse_routed_experts(specs: list[str], builtin: bool) -> None:
    """One line, before anything starts, when these backends cannot give routed experts."""
    from ..proxy.upstream.backends import parse_backend
    from ..proxy.upstream.routed import refusal

    reason = refusal((parse_backend(spec)[1] for spec in specs), builtin)
    if reason is not None:
        raise click.ClickException(f"--capture-routed-experts: {reason}")


def checked_backends(values: tuple[str, ...]) -> list[str]:
    """--backend values (each may hold several, space-separated, as ROLLTAP_BACKENDS does),
    refused with one line before anything starts when one is not `[KIND=]URL`."""
    from ..proxy.upstream.backends import parse_backend

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


def config_option(f: F) -> F:
    """--config FILE: a TOML file whose keys are the command's flags (dashes or underscores), read
    before any flag as click's default_map, so every flag is covered and the command line (and a
    ROLLTAP_* variable) overrides the file. TOML only: tomllib is in the standard library, and
    rolltap depends on no YAML parser."""
    return click.option(
        "--config",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        is_eager=True,
        expose_value=False,
        callback=_read_config,
        metavar="FILE",
        help='TOML file of this command\'s flags, e.g. `port = 8100`, `backend = ["URL"]`, '
        "`open = true`; flags given on the command line override it.",
    )(f)


def _read_config(ctx: click.Context, param: click.Parameter, path: Path | None) -> None:
    import difflib
    import tomllib

    if path is None:
        return
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise click.ClickException(f"--config {path}: {e}") from None
    flags: dict[str, click.Option] = {}
    for p in ctx.command.params:
        if p is not param and isinstance(p, click.Option):
            flags.update((o.lstrip("-").replace("-", "_"), p) for o in p.opts if o[:2] == "--")
    defaults: dict[str, Any] = {}
    for key, value in data.items():
        flag = flags.get(key.replace("-", "_"))
        if flag is None or flag.name is None:
            known = sorted(k.replace("_", "-") for k in flags)
            close = difflib.get_close_matches(key.replace("_", "-"), known, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise click.ClickException(
                f"--config {path}: unknown key {key!r}; {hint}the keys are the flags of "
                f"`{ctx.command_path} --help`"
            )
        if isinstance(value, dict):
            raise click.ClickException(f"--config {path}: {key} is a table, not a flag's value")
        if flag.multiple and not isinstance(value, list):
            value = [value]
        try:
            defaults[flag.name] = flag.type_cast_value(ctx, value)
        except click.BadParameter as e:
            raise click.ClickException(f"--config {path}: {key} = {value!r}: {e.message}") from None
    ctx.default_map = {**(ctx.default_map or {}), **defaults}
