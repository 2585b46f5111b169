"""Puts a task into a fresh sandbox (its environment files and setup script, where no image
did that already) and runs its reference solution (the oracle)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from ..tasks import Task
from .base import ExecResult, Sandbox
from .errors import SetupFailed

ROOT = "0"
"""Setup and housekeeping run as root, as a Dockerfile's RUN does (where there are users)."""


async def provision(sandbox: Sandbox, task: Task, *, log: Path | None = None) -> None:
    """Copies environment/files into the workdir and runs the setup script there, unless the
    sandbox's image was built from the task's own Dockerfile (which did both)."""
    if sandbox.environment_built:
        return
    env = task.environment
    if env.files_dir is not None:
        await sandbox.put(env.files_dir, task.workdir)
    if env.setup_script is not None:
        result = await sandbox.exec(
            env.setup_script, timeout=env.build_timeout_sec, user=ROOT, log=log, proxy=False
        )
        if not result.ok:
            what = "timed out" if result.timed_out else f"exited with {result.exit_code}"
            raise SetupFailed(f"{task.id}: setup {what}: {result.stderr.strip()[-500:]}")


async def solve(sandbox: Sandbox, task: Task, *, log: Path | None = None) -> ExecResult:
    """Runs solution/solve.sh from /solution in the workdir, within the agent's timeout."""
    if task.solution_dir is not None:
        await sandbox.put(task.solution_dir, "/solution")
    elif task.solution_script is not None:
        await put_script(sandbox, "/solution/solve.sh", task.solution_script)
    else:
        raise ValueError(f"{task.id}: the task has no reference solution")
    return await sandbox.exec(
        ["bash", "/solution/solve.sh"],
        env=task.solution_env,
        timeout=task.agent_timeout_sec,
        user=task.agent_user,
        log=log,
        proxy=False,
    )


async def put_script(sandbox: Sandbox, inside_path: str, text: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "script.sh"
        script.write_text(text)
        script.chmod(0o755)
        await sandbox.put(script, inside_path)
