"""`rolltap serve`: the proxy, in front of the given backends or the built-in engine."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import shutil
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import click

from ..engine.adapter import NONE
from ..engine.command import adapter_option
from ..proxy.app import Extension
from ..proxy.context import ProxySettings
from ..proxy.control.admin import ExposedWithoutToken, check_exposure
from ..proxy.secret import signing_key
from ..proxy.server import RunningProxy, serve_until_stopped
from ..proxy.tokenin.options import TokenInOptions
from ..proxy.workers import run_workers
from ..runner.sandboxes.identity import sandbox_user
from ..store import Store
from ..store.url import resolve_url
from .options import (
    builtin_adapter_args,
    capture_routed_experts_option,
    check_port,
    checked_backends,
    config_option,
    db_option,
    engine_arg_option,
    max_tokens_cap_option,
    refuse_routed_experts,
)
from .token_in import token_in_options


@click.command()
@config_option
@click.option(
    "--backend",
    "backends",
    multiple=True,
    envvar="ROLLTAP_BACKENDS",
    metavar="[KIND=]URL",
    help="An inference backend (repeatable): a vLLM-dialect URL, or sglang=URL / openai=URL. "
    "Without any, rolltap starts its built-in engine.",
)
@db_option
@click.option("--host", default="127.0.0.1", show_default=True, envvar="ROLLTAP_HOST")
@click.option("--port", default=8100, show_default=True, envvar="ROLLTAP_PORT")
@click.option("--unix-socket", envvar="ROLLTAP_UNIX_SOCKET", help="Also listen here (sandboxes).")
@click.option("--open", "open_mode", is_flag=True, help="Create a rollout for an unknown key.")
@click.option(
    "--admin-token",
    envvar="ROLLTAP_ADMIN_TOKEN",
    help="Required on /admin and /metrics when set; needed to listen beyond loopback.",
)
@click.option("--max-body-mb", default=32, show_default=True, help="Largest request body.")
@max_tokens_cap_option
@click.option(
    "--model-alias",
    "model_aliases",
    multiple=True,
    metavar="NAME=SERVED",
    help="Answer calls asking for model NAME with the served model SERVED (repeatable; NAME * "
    "for every name not served). With one model served, every other name maps to it anyway.",
)
@click.option(
    "--secret",
    envvar="ROLLTAP_SECRET",
    help="Signs the references the proxy hands to harnesses (Responses/Messages round trips); "
    "default: a random secret kept beside the SQLite file. Give proxies sharing a database the "
    "same one.",
)
@click.option("--model", "engine_model", help="Built-in engine: model dir or GGUF file.")
@click.option("--device", default="cpu", show_default=True, help="Built-in engine: cpu or cuda.")
@engine_arg_option
@adapter_option("none")
@click.option("--weight-version", help="Weight version recorded until /admin/resume sets one.")
@click.option(
    "--rollout-expiry",
    "rollout_expiry",
    default=3600.0,
    show_default=True,
    type=click.FloatRange(min=0),
    metavar="SECONDS",
    help="A rollout outside any batch (made by hand, --open, POST /admin/rollouts) with no call "
    "for this long ends `expired`; 0: never.",
)
@click.option(
    "--no-cache-salt",
    "no_cache_salt",
    is_flag=True,
    help="Send vLLM-dialect calls no per-version cache_salt; each weight commit resets their "
    "prefix caches instead (POST /reset_prefix_cache, vLLM's dev-mode route).",
)
@click.option(
    "--runner",
    is_flag=True,
    help="Also serve the rollout service (/v1/batches): trainers submit batches and receive "
    "complete groups of trajectories (see rolltap.client).",
)
@click.option(
    "--runner-sandboxes",
    default="bwrap,docker,apptainer",
    show_default=True,
    help="Sandbox kinds batches may use (comma list; the first is the default).",
)
@click.option(
    "--runner-concurrency",
    default=16,
    show_default=True,
    type=click.IntRange(min=1),
    help="Rollouts in each stage (INIT/RUN/EVAL) at once, over all batches.",
)
@click.option(
    "--runner-tasks-root",
    type=click.Path(file_okay=False, path_type=Path),
    help="Task paths that batches name must lie under this directory.",
)
@click.option(
    "--runner-ray",
    metavar="auto|ADDRESS",
    help="Run the rollout service's batches on this Ray cluster (pip install 'rolltap[ray]'): "
    "each rollout on a node offering the `sandbox` resource. Needs a PostgreSQL --db.",
)
@click.option(
    "--workers",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    envvar="ROLLTAP_WORKERS",
    help="Proxy processes on this port (SO_REUSEPORT), each with its own event loop and store "
    "writer. Pause and weight updates reach them all on PostgreSQL only.",
)
@token_in_options
@capture_routed_experts_option
@click.option(
    "--drain-seconds",
    default=10.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="On SIGTERM or Ctrl-C, how long calls in flight may take to finish; then the built-in "
    "engine stops mid-answer and they end as failed (a second signal stops at once).",
)
@click.option(
    "--runner-egress-config",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="With --runner: the egress config (TOML: allow, intercept_hosts, upstream_ca, "
    "[resolve]) for batches that ask for egress (docs/egress.md).",
)
@click.option(
    "--store-spill",
    envvar="ROLLTAP_STORE_SPILL",
    type=click.Path(file_okay=False),
    help="Where the records of sampled calls go when the store stays unreachable past its "
    "outage limit (a full disk), to be written to it once it is back; best on another "
    "filesystem than the store's (default: the user cache).",
)
@click.option("-v", "--verbose", is_flag=True)
def serve(
    backends: tuple[str, ...],
    db_url: str | None,
    host: str,
    port: int,
    unix_socket: str | None,
    open_mode: bool,
    admin_token: str | None,
    max_body_mb: int,
    max_tokens_cap: int | None,
    model_aliases: tuple[str, ...],
    secret: str | None,
    engine_model: str | None,
    device: str,
    engine_args: tuple[str, ...],
    adapter: str,
    weight_version: str | None,
    rollout_expiry: float,
    no_cache_salt: bool,
    runner: bool,
    runner_sandboxes: str,
    runner_concurrency: int,
    runner_tasks_root: Path | None,
    runner_ray: str | None,
    workers: int,
    token_in: TokenInOptions,
    capture_routed_experts: bool,
    drain_seconds: float,
    runner_egress_config: Path | None,
    store_spill: str | None,
    verbose: bool,
) -> None:
    """Serve the OpenAI-compatible proxy that records every call with its token ids."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING)
    specs = checked_backends(backends)
    ctx = click.get_current_context()
    engine_args = (*builtin_adapter_args(ctx, adapter, engine_model, not specs), *engine_args)
    if capture_routed_experts:
        refuse_routed_experts(specs, builtin=not specs)
    # Before the store is created or an engine loaded: a taken port fails in a second.
    check_port(host, port)
    settings = ProxySettings(
        backends=specs,
        host=host,
        port=port,
        unix_socket=unix_socket,
        # Sandboxes on this machine connect as the sandbox user's group (runner/sandboxes).
        unix_socket_group=sandbox_user().gid,
        open_mode=open_mode,
        store_spill=store_spill,
        admin_token=admin_token,
        max_body_bytes=max_body_mb * 1024 * 1024,
        weight_version=weight_version,
        max_tokens_cap=max_tokens_cap,
        model_aliases=_aliases(model_aliases),
        secret=secret,
        workers=workers,
        token_in=token_in,
        cache_salt=not no_cache_salt,
        rollout_expiry_seconds=rollout_expiry,
        capture_routed_experts=capture_routed_experts,
    )
    resolve_url(db_url)  # a bad URL fails here, before an engine is started for nothing
    if runner_ray is not None and not runner:
        raise click.BadParameter("give --runner too", param_hint="--runner-ray")
    if runner_ray is not None and resolve_url(db_url).is_sqlite:
        raise click.BadParameter(
            "the Ray nodes share the store: give a PostgreSQL --db", param_hint="--runner-ray"
        )
    if workers > 1 and port == 0:
        raise click.BadParameter("workers share one port: give --port", param_hint="--workers")
    if workers > 1 and runner:
        raise click.BadParameter(
            "the rollout service runs in one process: use --workers 1 with --runner",
            param_hint="--workers",
        )
    try:
        check_exposure(host, admin_token)
    except ExposedWithoutToken as e:
        raise click.ClickException(str(e)) from None
    extensions: list[Extension] = []
    if runner:
        from ..runner.egress import BadEgressSetting, load_settings
        from ..runner.service.options import runner_extension

        try:
            egress = load_settings("none", (), runner_egress_config)
        except BadEgressSetting as e:
            raise click.BadParameter(str(e), param_hint="--runner-egress-config") from None
        try:
            extend = runner_extension(
                settings,
                runner_sandboxes,
                runner_concurrency,
                runner_tasks_root,
                click.echo,
                egress=egress,
                ray_address=runner_ray,
            )
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--runner-sandboxes") from None
        extensions.append(extend)
    if weight_version is not None:
        engine_args = (*engine_args, f"--weight-version={weight_version}")

    def ready(proxy: RunningProxy) -> None:
        pool = proxy.ctx.pool.all()
        backends_shown = ", ".join(b.url + ("" if b.healthy else " (down)") for b in pool)
        click.echo(f"rolltap proxy on {proxy.url}  (store: {resolve_url(db_url).render()})")
        click.echo(f"  backends: {backends_shown}")
        if proxy.ctx.settings.builtin_engine:
            click.echo(f"  adapter: {_adapter_shown(engine_args)}")
        served = sorted(proxy.ctx.names.served)
        if served:
            other = "; any other name maps to it" if len(served) == 1 else ""
            click.echo(f"  models: {', '.join(served)}{other}")
        if proxy.unix_socket:
            click.echo(f"  unix socket: {proxy.unix_socket}")
        click.echo(f"  harness base URL: {proxy.url}/r/<rollout key>/v1")
        if open_mode:
            click.echo("  --open: unknown keys create rollouts (local experiments only)")
        if runner:
            click.echo(f"  rollout service: {proxy.url}/v1/batches")
        if workers > 1:
            click.echo(f"  {workers} workers on port {port}")

    engine = _builtin_engine(engine_model, device, engine_args)
    if workers > 1:
        sys.exit(_run_workers(settings, db_url, ready, engine))
    try:
        _run(settings, db_url, ready, engine, extensions, drain_seconds)
    finally:
        if runner and unix_socket is None and settings.unix_socket:
            # The private folder runner_extension made for the sandboxes' socket.
            shutil.rmtree(Path(settings.unix_socket).parent, ignore_errors=True)


def _adapter_shown(engine_args: tuple[str, ...]) -> str:
    """The built-in engine's adapter as its flags give it: the last --adapter wins, as it does
    for the engine's own parser (an --engine-arg after rolltap's own)."""
    adapter = NONE
    for i, arg in enumerate(engine_args):
        if arg.startswith("--adapter="):
            adapter = arg.removeprefix("--adapter=")
        elif arg == "--adapter" and i + 1 < len(engine_args):
            adapter = engine_args[i + 1]
    return "none (the plain model)" if adapter.lower() == NONE else adapter


def _aliases(specs: tuple[str, ...]) -> dict[str, str]:
    from ..proxy.upstream.model_names import parse_alias

    try:
        return dict(parse_alias(spec) for spec in specs)
    except ValueError as e:
        raise click.ClickException(f"--model-alias {e}") from None


def _builtin_engine(
    model: str | None, device: str, engine_args: tuple[str, ...]
) -> Callable[[], Awaitable[tuple[str, Callable[[], Awaitable[None]]]]]:
    async def start() -> tuple[str, Callable[[], Awaitable[None]]]:
        from ..engine.launch import ANSWER_LIMITS, EngineProcess

        click.echo("no --backend: starting the built-in engine (loads the model once)...")
        args = (*ANSWER_LIMITS, *engine_args)
        engine = await EngineProcess.astart(model, device=device, extra_args=args)

        async def stop() -> None:
            await asyncio.to_thread(engine.stop)

        return engine.url, stop

    return start


def _run_workers(
    settings: ProxySettings,
    db_url: str | None,
    ready: Callable[[RunningProxy], None],
    engine: Callable[[], Awaitable[tuple[str, Callable[[], Awaitable[None]]]]],
) -> int:
    """What must happen once happens here, then the workers fork (proxy/workers.py)."""
    stop_engine: Callable[[], Awaitable[None]] | None = None

    async def prepare() -> None:
        nonlocal stop_engine
        store = await Store.connect(db_url)  # migrates once, not N times at once
        try:
            signing_key(settings.secret, store.db.url)  # one secret file, not a race of N
        finally:
            await store.close()
        if not settings.backends:
            url, stop_engine = await engine()
            settings.backends = [url]
            settings.builtin_engine = True

    asyncio.run(prepare())

    def worker(index: int) -> None:
        mine = dataclasses.replace(
            settings, unix_socket=settings.unix_socket if index == 0 else None
        )
        _run(mine, db_url, ready if index == 0 else lambda _: None, None)

    try:
        return run_workers(settings.workers, worker)
    finally:
        if stop_engine is not None:
            stopping = stop_engine

            async def stop() -> None:
                await stopping()

            asyncio.run(stop())


def _run(
    settings: ProxySettings,
    db_url: str | None,
    ready: Callable[[RunningProxy], None],
    engine: Callable[[], Awaitable[tuple[str, Callable[[], Awaitable[None]]]]] | None,
    extensions: Sequence[Extension] = (),
    drain_seconds: float = 10.0,
) -> None:
    if not extensions:
        # The rollout service starts sandboxes as another user, which uvloop's subprocesses
        # cannot do (no user/group arguments); the proxy alone gains from it.
        try:
            import uvloop

            uvloop.install()
        except ImportError:
            pass
    asyncio.run(
        serve_until_stopped(
            settings,
            db_url,
            on_ready=ready,
            start_engine=engine,
            extensions=extensions,
            drain_seconds=drain_seconds,
            say=lambda message: click.echo(message, err=True),
        )
    )
