"""The oracle: runs a task's reference solution as the agent, as Harbor's oracle agent does.

`rolltap run TASKS --harness oracle` sends every task through the normal pipeline (sandbox,
setup, the proxy, the verifier, the store) with `solution/solve.sh` (or the JSONL shorthand's
`solution`) in the agent's place: copied to /solution, run with bash in the workdir with the
task's `[solution] env`, its output kept as /logs/agent/oracle.txt. It makes no model call. A task
whose verifier does not give its own solution full reward is broken: `failed_oracle` names it
before anyone trains on it.

A solution can also be a scripted agent: `python3 /solution/rolltap-step COMMAND` (copied in
beside it, runner/harnesses/step.py) sends each command to the proxy as a harness sends a
model's tool call (refused, since the oracle serves no model, and recorded), then runs it. The
reward-hack detectors read those commands from the record as they read a real agent's
(examples/hacks/: an honest solution and an exploit per detector).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from rolltap import __version__

from ..summary import BatchSummary, TaskSummary
from .base import (
    BuiltIn,
    Dialect,
    HarnessExit,
    Installation,
    Launch,
    Outcome,
    RunContext,
    base_env,
    exit_outcome,
)

SOLUTION = PurePosixPath("/solution")
NAME = "oracle"
STEP = Path(__file__).with_name("step.py")
"""rolltap-step, the scripted agent's step (copied to /solution/rolltap-step)."""


class Oracle:
    name: str = NAME
    dialect: Dialect = "chat"
    """It makes no call; the pipeline still gives it a rollout URL like any harness."""
    packages: BuiltIn = BuiltIn()
    version: str = __version__

    def launch(self, ctx: RunContext, installation: Installation) -> Launch:
        task = ctx.task
        if task is None:
            raise ValueError("the oracle runs a task's solution: RunContext.task must be set")
        env = base_env(ctx, installation) | {
            "DEBIAN_FRONTEND": "noninteractive",
            # Where a scripted agent's steps go (rolltap-step), as a harness's calls would.
            "OPENAI_BASE_URL": ctx.openai_base_url,
            "OPENAI_API_KEY": ctx.key,
            "ANTHROPIC_BASE_URL": ctx.rollout_url,
            "ROLLTAP_MODEL": ctx.model,
        }
        solve = SOLUTION / "solve.sh"
        argv: tuple[str, ...] = ("bash", str(solve))
        files: dict[PurePosixPath, str] = {}
        copies: dict[PurePosixPath, Path] = {}
        if task.solution_dir is not None:
            copies[SOLUTION] = task.solution_dir
        elif task.solution_script is not None:
            files[solve] = task.solution_script
        else:
            missing = f"task {task.id} has no reference solution (solution/solve.sh)"
            argv = ("sh", "-c", f"echo '{missing}' >&2; exit 2")
        copies[SOLUTION / "rolltap-step"] = STEP
        return Launch(
            argv=argv,
            env=env | dict(task.solution_env),
            cwd=ctx.workdir,
            files=files,
            copies=copies,
            stdout_path=ctx.logs_dir / "oracle.txt",
        )

    def classify(self, ctx: RunContext, exit: HarnessExit) -> Outcome:
        return exit_outcome(ctx, exit)


def failed_oracle(summary: BatchSummary) -> Sequence[TaskSummary]:
    """The tasks whose reference solution did not reach full reward in every sample."""
    return [t for t in summary.tasks if t.passed < t.samples]


__all__ = ["NAME", "Oracle", "failed_oracle"]
