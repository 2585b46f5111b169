"""The rollout service inside the proxy (`rolltap serve --runner`): one process, one store.

Rollouts reach the proxy through its unix socket, the version clock is its hold, and the model
harnesses ask for is whatever its first healthy backend serves.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import platformdirs
from aiohttp import web

from ...proxy.context import ProxyContext
from ...proxy.errors import UpstreamUnavailable
from ..egress import EgressSettings
from ..harnesses import Harness, Installation, adapters, builtins
from ..rollout import Pools
from .clock import HoldClock
from .executor import LocalHost, ProviderOpener, local_executors
from .routes import mount
from .service import Service
from .spec import PoolSizes, ServiceLimits


@dataclass(frozen=True)
class RunnerSettings:
    limits: ServiceLimits = field(default_factory=ServiceLimits)
    pools: PoolSizes | None = None
    """INIT/RUN/EVAL slots shared by all batches; default: `limits.max_concurrency` each."""
    logs_root: Path | None = None
    """Where rollout logs go (default: <user data dir>/rolltap/runs)."""
    sandbox_image: str | None = None
    harnesses: Mapping[str, Harness] | None = None
    """The harnesses batches may name (default: every harness rolltap has)."""
    installations: Mapping[str, Installation] = field(default_factory=dict)
    providers: Mapping[str, ProviderOpener] = field(default_factory=dict)
    egress: EgressSettings = field(default_factory=EgressSettings)
    """`serve --egress-config`: what batches asking for egress get (docs/egress.md)."""
    ray_address: str | None = None
    """Run batches on this Ray cluster ("auto": the one this machine belongs to) instead of in
    this process's sandboxes (runner/cluster/)."""


def extension(settings: RunnerSettings) -> Callable[[web.Application, ProxyContext], None]:
    """What `start_proxy(..., extensions=[...])` takes to serve /v1/batches beside the proxy."""

    def extend(app: web.Application, ctx: ProxyContext) -> None:
        mount(app, service_for(ctx, settings))

    return extend


def service_for(ctx: ProxyContext, settings: RunnerSettings) -> Service:
    socket = ctx.settings.unix_socket
    if socket is None:
        raise ValueError("the rollout service needs the proxy's unix socket (--unix-socket)")
    limits = settings.limits
    sizes = settings.pools or PoolSizes(*(limits.max_concurrency,) * 3)
    harnesses = dict(
        settings.harnesses if settings.harnesses is not None else adapters() | builtins()
    )
    model = _ServedModel(ctx)
    host = LocalHost(
        store=ctx.store,
        proxy_socket=Path(socket),
        model=model.name,
        logs_root=settings.logs_root or platformdirs.user_data_path("rolltap") / "runs",
        pools=Pools.sized(sizes.init, sizes.run, sizes.eval),
        harnesses=harnesses,
        installations=settings.installations,
        sandbox_image=settings.sandbox_image,
        providers=settings.providers,
        revoke_key=ctx.rollouts.revoke,
        egress=settings.egress,
    )
    executors = local_executors(host)
    if settings.ray_address is not None:
        from ..cluster.service import ray_executors  # the optional rolltap[ray]

        executors = ray_executors(ctx, settings.ray_address, model.name)
    return Service(
        ctx.store,
        HoldClock(ctx.hold),
        executors,
        harnesses=harnesses,
        model=model.resolve,
        limits=limits,
    )


class _ServedModel:
    """The model name of the proxy's first healthy backend, asked once."""

    def __init__(self, ctx: ProxyContext) -> None:
        self._ctx = ctx
        self._name: str | None = None

    def name(self) -> str:
        assert self._name is not None, "resolve() runs before any batch starts"
        return self._name

    async def resolve(self) -> str:
        if self._name is not None:
            return self._name
        for backend in self._ctx.pool.healthy() or self._ctx.pool.all():
            try:
                async with self._ctx.client().get(
                    backend.endpoint("/v1/models"), timeout=aiohttp.ClientTimeout(total=30)
                ) as resp:
                    data = await resp.json(content_type=None)
            except (aiohttp.ClientError, TimeoutError, ValueError):
                continue
            models = [m.get("id") for m in data.get("data", []) if isinstance(m, dict)]
            if models and isinstance(models[0], str):
                self._name = models[0]
                return self._name
        raise UpstreamUnavailable("no backend says which model it serves (GET /v1/models)")
