"""Runs batches of tasks with unmodified harnesses in sandboxes and stores verified rewards."""

from importlib import import_module
from typing import TYPE_CHECKING, Any

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


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(module, __name__), name)
    globals()[name] = value
    return value


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
