"""The rollout service's batches on a Ray cluster (`rolltap serve --runner --runner-ray ADDR`).

Same executor seam as the local one (runner/service/executor.py): per batch, an agent on every
sandbox node, each rollout Ray work needing one `sandbox` unit. The nodes' proxies serve the
engines this proxy serves and record into its store, which must therefore be PostgreSQL.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable

from ...proxy.context import ProxyContext
from ..harnesses import adapter
from ..harnesses.base import BuiltIn
from ..harnesses.oracle import NAME as ORACLE
from ..provenance import harness_metadata
from ..service.executor import ExecutorFactory, RolloutExecutor
from ..service.spec import BatchSpec
from .batch import connect
from .dispatch import RayDispatch
from .node import NodeSetup


def ray_executors(ctx: ProxyContext, address: str, model: Callable[[], str]) -> ExecutorFactory:
    url = ctx.store.db.url
    if url.is_sqlite:
        raise ValueError("--runner-ray: the nodes share the store, so it must be PostgreSQL")

    @contextlib.asynccontextmanager
    async def open_executor(spec: BatchSpec, batch_id: str) -> AsyncIterator[RolloutExecutor]:
        harness = adapter(spec.harness)
        installed_from = "builtin" if isinstance(harness.packages, BuiltIn) else "host"
        settings = {
            "model": model(),
            "max_steps": spec.budgets.max_steps,
            "timeout": spec.budgets.timeout,
        }
        setup = NodeSetup(
            db_url=url.url.render_as_string(hide_password=False),
            batch_id=batch_id,
            harness=spec.harness,
            sandbox=spec.sandbox,
            backends=tuple(f"{b.kind.value}={b.url}" for b in ctx.pool.all()),
            model=model(),
            needs_model=spec.harness != ORACLE,
            timeout=spec.budgets.timeout,
            max_steps=spec.budgets.max_steps,
            retries=spec.retries,
            run_meta=harness_metadata(harness, installed_from, settings),
        )
        connect(address)
        dispatch = RayDispatch(setup, ctx.store, retries=spec.retries)
        try:
            await dispatch.open()
            yield dispatch
        finally:
            await dispatch.close()

    return open_executor
