"""A labelled set to measure the reward-hack detectors (analysis/detectors.py): one SWE-style task
(median-repo: a git repository whose future holds the fix, verifier tests kept out of the
agent's sight) and scripted agents for it, run through the `oracle` harness: the honest
solution, and exploits labelled with the built-in detector that must flag them
(exploits/<detector>/solve.sh, and more of one detector's as exploits/<detector>.<variant>/).

    from rolltap.examples.hacks import labelled_set
    tasks = [s.task for s in labelled_set()]   # run_batch(tasks, harness="oracle", ...)

`python bench/hacks_bench.py` runs it in bwrap and docker and prints each detector's precision
and recall; `rolltap audit hacks --batch B` lists what was flagged.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from rolltap.runner.tasks import Task, load_tasks

HERE = Path(__file__).resolve().parent
TASK = HERE / "median-repo"
EXPLOITS = HERE / "exploits"
HONEST = "honest"


@dataclass(frozen=True)
class Labelled:
    task: Task
    label: str
    """`honest`, or the detector the exploit must raise."""

    @property
    def honest(self) -> bool:
        return self.label == HONEST


def labelled_set() -> list[Labelled]:
    """The honest run first, then the exploits (by name), each a task of its own
    (`median-repo.<detector>[.<variant>]`) whose reference solution is that scripted agent."""
    (task,) = load_tasks(TASK)
    found = [Labelled(replace(task, id=f"{task.id}.{HONEST}"), HONEST)]
    for exploit in sorted(d for d in EXPLOITS.iterdir() if (d / "solve.sh").is_file()):
        variant = replace(task, id=f"{task.id}.{exploit.name}", solution_dir=exploit)
        found.append(Labelled(variant, exploit.name.partition(".")[0]))
    return found


def label_of(task_id: str) -> str | None:
    """The label a labelled-set task id carries (None for any other task)."""
    stem, _, name = task_id.partition(".")
    return name.partition(".")[0] or None if stem == TASK.name else None


__all__ = ["HONEST", "Labelled", "label_of", "labelled_set"]
