"""Runs batches of tasks with unmodified harnesses in sandboxes and stores verified rewards."""

from .batch import BatchResult, RunOptions, run_batch, run_spec
from .rollout import BatchProgress, RolloutResult
from .summary import BatchSummary, TaskSummary

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
