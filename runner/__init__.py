"""Runs batches of tasks with unmodified harnesses in sandboxes and stores verified rewards."""

from typing import TYPE_CHECKING

from ..lazy import lazy_names

if TYPE_CHECKING:
    from .batch import BatchResult, RunOptions, run_batch, run_spec
    from .rollout import BatchProgress, RolloutResult
    from .summary import BatchSummary, TaskSummary

# Loaded on first use: importing a part of the runner (a harness's name, the sandbox kinds, for
# `rolltap run --help`) must not load the batch pipeline, the store and the proxy with it.
_LAZY = {
    "BatchResult": ".batch",
    "RunOptions": ".batch",
    "run_batch": ".batch",
    "run_spec": ".batch",
    "BatchProgress": ".rollout",
    "RolloutResult": ".rollout",
    "BatchSummary": ".summary",
    "TaskSummary": ".summary",
}


__getattr__ = lazy_names(__name__, _LAZY)


__all__ = [
    "BatchProgress",
    "BatchResult",
    "BatchSummary",
    "RolloutResult",
    "RunOptions",
    "TaskSummary",
    "run_batch",
    "run_spec",
]
