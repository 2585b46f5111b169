"""`run_batch_on_ray`: `run_batch` with its rollouts spread over a Ray cluster's sandbox nodes.

The driver (this process) plans the batch in the shared PostgreSQL store exactly as a local
run does (runner/plan.py: reruns resume) and runs its rollouts through the cluster's executor
(service.py): one agent per node (node.py), results collected as they finish. The engines behind
`backends` must be reachable from every node; each node's proxy records into the same store.
`rolltap run --ray` takes the same path (runner/batch.py: `run_spec` with `RunOptions.ray`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ...proxy.tokenin.options import TokenInOptions
from ..batch import BatchResult, RunOptions, run_spec, tasks_of
from ..rollout import BatchProgress
from ..service.spec import BatchSpec, Budgets
from ..tasks import Task


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
    loaded, source = tasks_of(tasks)
    spec = BatchSpec(
        tasks=loaded,
        tasks_source=source,
        harness=harness,
        sandbox=sandbox,
        samples_per_task=samples,
        budgets=Budgets(max_calls, max_tokens, timeout, max_steps),
        retries=retries,
        id=batch,
    )
    options = RunOptions(
        db=db,
        backends=tuple(backends),
        model=model,
        sandbox_image=sandbox_image,
        token_in=token_in,
        logs_root=logs_root,
        ray=address,
    )
    return await run_spec(spec, options, meta=meta, progress=progress, say=say)
