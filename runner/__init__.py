"""Runs batches of tasks with unmodified harnesses in sandboxes and stores verified rewards."""

from .batch import BatchResult, run_batch
from .rollout import BatchProgress, RolloutResult
from .summary import BatchSummary, TaskSummary

__all__ = [
    "BatchProgress",
    "BatchResult",
    "BatchSummary",
    "RolloutResult",
    "TaskSummary",
    "run_batch",
]
