"""One real mini-swe-agent rollout of examples/tasks' hello-file against an engine: the tests of
the built-in engine with and without rolltap's adapter run the same episode and differ in what
they assert about it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rolltap.runner import run_batch
from rolltap.runner.harnesses import NotInstalled, adapter, installation
from rolltap.runner.rollout import RolloutResult
from rolltap.runner.tasks import load_tasks
from rolltap.store import Store
from tests.support.sandboxes import provider_of

TASKS = Path(__file__).resolve().parents[2] / "examples" / "tasks"


async def hello_file_rollout(
    engine_url: str, store: Store, tmp_path: Path, *, sandbox: str = "local", **batch: Any
) -> RolloutResult:
    """mini-swe-agent (the test skips where it is not installed) on hello-file in `sandbox`;
    `batch` holds the run's budgets and meta (run_batch's keywords)."""
    harness = adapter("mini-swe-agent")
    try:
        installed = installation(harness)
    except NotInstalled:
        pytest.skip("mini-swe-agent is not installed: run `rolltap harness install mini-swe-agent`")
    tasks = [t for t in load_tasks(TASKS) if t.id == "hello-file"]
    async with provider_of(sandbox, tmp_path / "boxes") as provider:
        result = await run_batch(
            tasks,
            harness=harness,
            installed=installed,
            sandbox=provider,
            backends=[engine_url],
            store=store,
            logs_root=tmp_path / "logs",
            **batch,
        )
    (rollout,) = result.results
    return rollout
