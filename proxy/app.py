"""The aiohttp application: routes, shared context, background tasks. No request logic here."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence

import aiohttp
from aiohttp import web

from ..analysis.hacks import HackFlag
from ..store import CallDialect, Store, StoreState
from .answers import ANSWERS, LIVE, AnswerSource
from .context import CONTEXT, ProxyContext, ProxySettings
from .control import admin, replicated, weights
from .control.expiry import expiring
from .control_bus import bus_for
from .dialects import messages_render, responses_render
from .dialects.chat import chat_completions
from .dialects.messages import count_tokens, hello, messages
from .dialects.responses import responses
from .errors import UpstreamUnavailable
from .handles import Handles
from .hold import WeightHold
from .intake import release_at_end
from .metrics import CONTENT_TYPE, Gauge, ProxyMetrics
from .middleware import errors
from .recall import Recall
from .recorder import Recorder
from .rollouts import FOR_SANDBOXES, Rollouts
from .secret import signing_key
from .tokenin.bridge import Bridges, LocalTemplate
from .tokenin.config import TokenIn
from .upstream.backends import BackendPool, parse_backend
from .upstream.forward import connection_tracing
from .upstream.model_names import ModelNames
from .upstream.routing import StickyRouter

_MODELS_TTL = 10.0
_SWEEP_EVERY = 30.0


def token_in(settings: ProxySettings) -> TokenIn:
    chosen = settings.token_in
    local = None
    if chosen.tokenizer is not None:
        local = Bridges(LocalTemplate.load(chosen.tokenizer, chosen.chat_template))
    return TokenIn(
        chosen.enabled,
        chosen.reasoning_parser,
        chosen.tool_call_parser,
        local=local,
        route=chosen.route,
    )


def make_context(settings: ProxySettings, store: Store) -> ProxyContext:
    admin.check_exposure(settings.host, settings.admin_token)
    pool = BackendPool()
    for spec in settings.backends:
        url, kind = parse_backend(spec)
        pool.add(url, kind)
    metrics = ProxyMetrics()
    recorded = {
        CallDialect.RESPONSES: responses_render.recorded_turn,
        CallDialect.MESSAGES: messages_render.recorded_turn,
    }
    handles = Handles(signing_key(settings.secret, store.db.url))
    router = StickyRouter(pool)
    hold = WeightHold(settings.weight_version)
    ctx = ProxyContext(
        settings=settings,
        store=store,
        rollouts=Rollouts(store, router=router, open_mode=settings.open_mode),
        pool=pool,
        router=router,
        hold=hold,
        metrics=metrics,
        recall=Recall(handles, store, recorded),
        bus=bus_for(store.db.url),
        recorder=Recorder(store, metrics, hold),
        tokenin=token_in(settings),
        names=ModelNames(settings.model_aliases),
    )
    metrics.gauges.append(
        Gauge(
            "rolltap_backend_inflight",
            "Calls in flight per backend.",
            lambda: [((("backend", b.url),), b.inflight) for b in pool.all()],
        )
    )
    metrics.gauges.append(
        Gauge(
            "rolltap_backend_healthy",
            "1 when the backend passes health checks.",
            lambda: [((("backend", b.url),), int(b.healthy)) for b in pool.all()],
        )
    )
    metrics.gauges.append(
        Gauge(
            "rolltap_replica",
            "1, labelled with this process's replica id (each worker and replica has one).",
            lambda: [((("replica", ctx.bus.replica_id),), 1)],
        )
    )
    metrics.gauges.append(
        Gauge("rolltap_paused", "1 while calls are held.", lambda: [((), int(ctx.hold.paused))])
    )
    return ctx


Extension = Callable[[web.Application, ProxyContext], None]
"""Adds routes to the proxy's TCP app (never the sandboxes' socket): the rollout service."""


def make_app(
    ctx: ProxyContext,
    *,
    for_sandboxes: bool = False,
    extensions: Sequence[Extension] = (),
    answers: AnswerSource = LIVE,
) -> web.Application:
    """The proxy's routes; `for_sandboxes` leaves out admin, metrics and extensions (the unix
    socket sandboxes reach it by); `answers`: where its calls' answers come from (answers.py)."""
    middlewares = [errors, release_at_end]
    if not for_sandboxes:
        middlewares.append(admin.admin_auth)
    app = web.Application(middlewares=middlewares, client_max_size=ctx.settings.max_body_bytes)
    app[CONTEXT] = ctx
    app[FOR_SANDBOXES] = for_sandboxes
    app[ANSWERS] = answers
    for prefix in ("/r/{key}/v1", "/v1"):
        app.router.add_post(f"{prefix}/chat/completions", chat_completions)
        app.router.add_post(f"{prefix}/responses", responses)
        app.router.add_post(f"{prefix}/messages", messages)
        app.router.add_post(f"{prefix}/messages/count_tokens", count_tokens)
        app.router.add_get(f"{prefix}/models", models)
    # Claude Code's base URL has no /v1; it probes HEAD {base}/api/hello at start.
    for prefix in ("/r/{key}", ""):
        app.router.add_get(f"{prefix}/api/hello", hello)
    app.router.add_get("/health", health)
    if not for_sandboxes:
        app.router.add_get("/metrics", metrics)
        admin.add_routes(app)
        weights.add_routes(app)
        for extend in extensions:
            extend(app, ctx)
        app.cleanup_ctx.append(_client_session)
        app.cleanup_ctx.append(_forgetting)
        app.cleanup_ctx.append(_counting_hacks)
        app.cleanup_ctx.append(expiring)
        app.cleanup_ctx.append(_replicas)
    return app


async def _forgetting(app: web.Application) -> AsyncIterator[None]:
    """Finished rollouts leave the proxy's caches at once; idle ones after a while."""
    ctx = app[CONTEXT]
    unsubscribe = ctx.store.on_finished(ctx.release)

    idle = ctx.settings.idle_rollout_seconds

    async def sweep() -> None:
        while True:
            await asyncio.sleep(min(_SWEEP_EVERY, idle / 2))
            for rollout_id in ctx.rollouts.sweep(idle):
                ctx.release(rollout_id)

    sweeper = asyncio.get_running_loop().create_task(sweep())
    try:
        yield
    finally:
        unsubscribe()
        sweeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sweeper


async def _counting_hacks(app: web.Application) -> AsyncIterator[None]:
    """Rollouts flagged through this proxy's store, per detector, on /metrics."""
    ctx = app[CONTEXT]

    def count(_: str, flags: list[HackFlag]) -> None:
        for detector in {f.detector for f in flags}:
            ctx.metrics.hacked.inc(detector=detector)

    unsubscribe = ctx.store.on_hack_flags(count)
    try:
        yield
    finally:
        unsubscribe()


async def _replicas(app: web.Application) -> AsyncIterator[None]:
    ctx = app[CONTEXT]
    await replicated.join(ctx)
    try:
        yield
    finally:
        await ctx.bus.stop()


async def _client_session(app: web.Application) -> AsyncIterator[None]:
    ctx = app[CONTEXT]
    # No per-host cap: a thousand open streams to one engine is the normal case here.
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=30)
    # The tracing tells a call sent on a pooled connection an engine dropped while idle, which
    # goes again once (upstream/forward.py), from one that failed on a fresh connection.
    ctx.session = aiohttp.ClientSession(
        connector=connector, auto_decompress=False, trace_configs=[connection_tracing()]
    )
    # Probe before serving: a backend that is down is never shown healthy, not even until the
    # first call to it fails.
    await ctx.pool.check_all(ctx.session, timeout=2.0)
    ctx.names.learn(await ctx.pool.served_models(ctx.session))
    checks = asyncio.get_running_loop().create_task(
        ctx.pool.run_health_checks(ctx.session, ctx.settings.health_interval)
    )
    try:
        yield
    finally:
        checks.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await checks
        await ctx.session.close()


async def models(request: web.Request) -> web.Response:
    """The rollout's backend's model list, passed through as it answered."""
    ctx = request.app[CONTEXT]
    state = await ctx.rollouts.resolve_request(request)
    Rollouts.refuse_revoked(state)
    backend = ctx.router.pick(state.id)
    cached = ctx.models_cache.get(backend.url)
    if cached is None or time.monotonic() - cached[0] > _MODELS_TTL:
        try:
            async with ctx.client().get(
                backend.endpoint("/v1/models"), timeout=aiohttp.ClientTimeout(total=10)
            ) as resp:
                body = await resp.read()
                if resp.status != 200:
                    raise UpstreamUnavailable(f"backend answered /v1/models with {resp.status}")
        except (aiohttp.ClientError, TimeoutError) as e:
            raise UpstreamUnavailable(f"backend unreachable: {type(e).__name__}") from None
        cached = ctx.models_cache[backend.url] = (time.monotonic(), body)
    return web.Response(body=cached[1], content_type="application/json")


async def health(request: web.Request) -> web.Response:
    """ok; degraded (serving, with a reason: the store is down, slow or backed up); or 503 when
    no backend can take a call."""
    ctx = request.app[CONTEXT]
    healthy = len(ctx.pool.healthy())
    store = ctx.store.status()
    body: dict[str, object] = {
        "status": "ok",
        "healthy_backends": healthy,
        "store": store.state.value,
        "store_queue": store.queued,
    }
    if store.state is not StoreState.OK:
        body["status"], body["reason"] = "degraded", f"store {store.state.value}: {store.reason}"
    if not healthy:
        body["status"], body["reason"] = "no healthy backend", "no backend passes health checks"
    return web.json_response(body, status=200 if healthy else 503)


async def metrics(request: web.Request) -> web.Response:
    """Prometheus exposition; behind the admin token when the proxy has one (control/admin.py)."""
    return web.Response(
        body=request.app[CONTEXT].metrics.render(),
        headers={"Content-Type": CONTENT_TYPE, "X-Content-Type-Options": "nosniff"},
    )
