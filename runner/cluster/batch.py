"""`rolltap run --ray ADDRESS`: a batch's rollouts spread over a Ray cluster's sandbox nodes.

The driver (this process) plans the batch in the shared PostgreSQL store exactly as a local
run does (runner/plan.py: reruns resume), starts one agent per node (node.py), and collects
results as they finish. The engines behind `--backend` must be reachable from every node; each
node's proxy records into the same store.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import ray

from ...proxy.tokenin.options import TokenInOptions
from ...store import RolloutStatus, Store
from ...store.url import resolve_url
from ..batch import BatchResult, default_batch_id
from ..harnesses import adapter
from ..harnesses.base import BuiltIn
from ..harnesses.oracle import NAME as ORACLE
from ..host import served_model, token_in_meta
from ..plan import Budget, plan
from ..provenance import harness_metadata, task_hash
from ..rollout import BatchProgress, RolloutResult
from ..summary import current_attempts, summarize
from ..tasks import Task, load_tasks
from .dispatch import RayDispatch
from .node import NodeSetup


def connect(address: str) -> None:
    """Join the cluster at `address` ("auto": the one this machine belongs to), once."""
    if not ray.is_initialized():
        ray.init(address=address, log_to_driver=False, configure_logging=False)


async def run_batch_on_ray(
    tasks: str | Path | Sequence[Task],
    *,
    address: str = "auto",
    harness: str = "mini-swe-agent",
    sandbox: str = "bwrap",
    samples: int = 1,
    backends: Sequence[str] = (),
    model: str | None = None,
    batch: str | None = None,
    timeout: float | None = None,
    db: str | None = None,
    max_calls: int | None = 100,
    max_tokens: int | None = None,
    max_steps: int | None = None,
    retries: int = 2,
    sandbox_image: str | None = None,
    logs_root: Path | None = None,
    progress: BatchProgress | None = None,
    meta: Mapping[str, Any] | None = None,
    token_in: TokenInOptions | None = None,
    say: Callable[[str], None] = lambda _: None,
) -> BatchResult:
    """Run (or resume) a batch on the Ray cluster at `address`; same results as run_batch."""
    loaded = list(tasks) if not isinstance(tasks, str | Path) else load_tasks(Path(tasks))
    if not loaded:
        raise ValueError("no tasks to run")
    url = resolve_url(db)
    if url.is_sqlite:
        raise ValueError(
            "a Ray batch's nodes share its store: give a PostgreSQL database "
            "(--db postgresql+asyncpg://USER@HOST/DB)"
        )
    adapter_ = adapter(harness)
    needs_model = adapter_.name != ORACLE
    if needs_model and not backends:
        raise ValueError("a Ray batch needs --backend: the engines every node's proxy reaches")
    if model is None:
        model = await served_model(backends[0]) if backends else "none"
    progress = progress or BatchProgress()
    store = await Store.connect(url.url.render_as_string(hide_password=False))
    try:
        source = tasks if isinstance(tasks, str | Path) else ",".join(t.id for t in loaded)
        batch_id = batch or default_batch_id(source, adapter_.name, model, sandbox, samples)
        todo, kept = await plan(
            store,
            batch_id,
            loaded,
            samples,
            harness=adapter_.name,
            model=model,
            budget=Budget(max_calls, max_tokens),
            meta={**(meta or {}), "sandbox": sandbox, **token_in_meta(token_in)},
        )
        if kept:
            say(f"batch {batch_id}: {len(kept)} rollouts already finished, {len(todo)} to run")
        installed_from = "builtin" if isinstance(adapter_.packages, BuiltIn) else "host"
        settings = {"model": model, "max_steps": max_steps, "timeout": timeout}
        setup = NodeSetup(
            db_url=url.url.render_as_string(hide_password=False),
            batch_id=batch_id,
            harness=adapter_.name,
            sandbox=sandbox,
            backends=tuple(backends),
            model=model,
            needs_model=needs_model,
            timeout=timeout,
            max_steps=max_steps,
            retries=retries,
            sandbox_image=sandbox_image,
            logs_root=logs_root,
            run_meta=harness_metadata(adapter_, installed_from, settings),
            task_hashes=await asyncio.to_thread(lambda: {t.id: task_hash(t) for t in loaded}),
            tasks=tuple({p.task.id: p.task for p in todo}.values()),
            token_in=token_in,
        )
        connect(address)
        dispatch = RayDispatch(setup, store, retries=retries)
        started = time.monotonic()
        try:
            await dispatch.open()
            caps = ", ".join(str(cap) for cap in dispatch.nodes.values())
            say(f"Ray: {len(dispatch.nodes)} sandbox nodes (caps {caps}); {len(todo)} rollouts")
            progress.total = len(todo)
            results = [
                _counted(progress, await done)
                for done in asyncio.as_completed([dispatch.run(p) for p in todo])
            ]
        finally:
            await dispatch.close()
        views = current_attempts(await store.rollouts(batch=batch_id))
        summary = summarize(batch_id, views, time.monotonic() - started)
        return BatchResult(batch_id, results, summary)
    finally:
        await store.close()


def _counted(progress: BatchProgress, result: RolloutResult) -> RolloutResult:
    progress.done += 1
    if result.status is not RolloutStatus.SUCCEEDED:
        progress.failed += 1
    if result.reward is not None:
        progress.rewards.append(result.reward)
    return result
