"""A batch's rollouts on a Ray cluster, through the executor seam (runner/service/executor.py).

Per batch, an agent on every sandbox node (node.py), each rollout Ray work needing one `sandbox`
unit. The nodes' proxies serve the engines in `RayHost.backends` and record into its store,
which must therefore be PostgreSQL. `rolltap run --ray` (runner/batch.py) and the rollout
service (`rolltap serve --runner --runner-ray ADDR`) both open batches here.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import ray

from ...proxy.context import ProxyContext
from ...proxy.tokenin.options import TokenInOptions
from ...store import Store
from ..egress import EgressMode
from ..harnesses.oracle import NAME as ORACLE
from ..service.executor import ExecutorFactory, RolloutExecutor
from ..service.spec import BatchSpec
from ..tasks import Task
from .dispatch import RayDispatch
from .node import NodeSetup


def connect(address: str) -> None:
    """Join the cluster at `address` ("auto": the one this machine belongs to), once."""
    if not ray.is_initialized():
        ray.init(address=address, log_to_driver=False, configure_logging=False)


@dataclass(frozen=True)
class RayHost:
    """What a batch on the cluster needs beyond its spec."""

    store: Store
    address: str
    backends: tuple[str, ...]
    """The engines every node's proxy reaches ([KIND=]URL)."""
    model: Callable[[], str]
    sandbox_image: str | None = None
    logs_root: Path | None = None
    token_in: TokenInOptions | None = None
    """The nodes' proxies' token-in parsers (the rollouts choose token-in in their meta)."""
    task_hashes: Mapping[str, str] = field(default_factory=dict)
    prebuild: tuple[Task, ...] = ()
    """Tasks whose images each node builds before its first rollout (prebuild.py)."""


def cluster_executors(host: RayHost) -> ExecutorFactory:
    url = host.store.db.url.url.render_as_string(hide_password=False)

    @contextlib.asynccontextmanager
    async def open_executor(spec: BatchSpec, batch_id: str) -> AsyncIterator[RolloutExecutor]:
        setup = NodeSetup(
            db_url=url,
            batch_id=batch_id,
            # A node's pools are its `sandbox` cap; its sandboxes have no egress gate; the
            # tasks it builds ahead are `prebuild`.
            spec=replace(spec, tasks=(), pools=None, egress=EgressMode.NONE, egress_allow=()),
            backends=host.backends,
            model=host.model(),
            needs_model=spec.harness != ORACLE,
            sandbox_image=host.sandbox_image,
            logs_root=host.logs_root,
            task_hashes=dict(host.task_hashes),
            token_in=host.token_in,
            tasks=host.prebuild,
        )
        connect(host.address)
        dispatch = RayDispatch(setup, host.store, retries=spec.retries)
        try:
            await dispatch.open()
            yield dispatch
        finally:
            await dispatch.close()

    return open_executor


def ray_executors(ctx: ProxyContext, address: str, model: Callable[[], str]) -> ExecutorFactory:
    """The rollout service's batches on the cluster, its nodes in front of its proxy's engines."""
    if ctx.store.db.url.is_sqlite:
        raise ValueError("--runner-ray: the nodes share the store, so it must be PostgreSQL")

    def open_executor(
        spec: BatchSpec, batch_id: str
    ) -> contextlib.AbstractAsyncContextManager[RolloutExecutor]:
        backends = tuple(f"{b.kind.value}={b.url}" for b in ctx.pool.all())
        host = RayHost(ctx.store, address, backends, model)
        return cluster_executors(host)(spec, batch_id)

    return open_executor
