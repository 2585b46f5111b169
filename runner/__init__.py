"""Runs batches of tasks with unmodified harnesses in sandboxes and stores verified rewards."""

from rolltap.runner.batch import BatchResult, run_batch
from rolltap.runner.rollout import BatchProgress, RolloutResult
from rolltap.runner.summary import BatchSummary, TaskSummary

__all__ = [
    "BatchProgress",
    "BatchResult",
    "BatchSummary",
    "RolloutResult",
    "TaskSummary",
    "run_batch",
]
