"""The sandbox the verifier grades in, by the task's `[verifier] sandbox` (runner/tasks.py).

`fresh` (the default): a new sandbox of the same kind from the task's own environment, set up
as the agent's was (environment/files and setup.sh, or the task's image), whose workdir is then
replaced by a copy of the agent's workdir, taken after the reap. That copy is the agent's whole
work product: what it changed anywhere else (HOME, /tmp, and in docker, as a root agent, the
image's own files: a .pth in the system's site-packages, a patched test runner) is not there,
and no process of the agent can be (slime's coding-agent grading; benchflow #604). The copy keeps
links as links and follows none (runner/sandboxes/workspace.py, docker_copy.py).

`agent`: the agent's own sandbox, after the reap, as Harbor grades; for tasks whose tests check
the environment beyond the workdir. Either way verify() then puts the task's test files back in
the workdir (runner/verify.py).
"""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

from .sandboxes.base import Sandbox, SandboxProvider, SandboxSpec
from .sandboxes.provision import provision
from .tasks import VerifierSandbox

__all__ = ["GRADING_SUFFIX", "grading_sandbox"]

GRADING_SUFFIX = ".verifier"
"""Added to the rollout id in the grading sandbox's spec: its workspace and labels are its own,
apart from the agent's sandbox, which lives until the rollout ends."""


@asynccontextmanager
async def grading_sandbox(
    provider: SandboxProvider,
    agent_spec: SandboxSpec,
    agent_box: Sandbox,
    *,
    image: str | None,
    log: Path | None = None,
) -> AsyncIterator[Sandbox]:
    """The sandbox to grade `agent_box`'s work in (the agent's sandbox has been reaped).
    `image`: the grading sandbox's image (None: the kind's default, the task's own image in
    docker), not the agent's, which may carry its harness. Sandbox errors pass through: a
    grading sandbox that would not start or take the work is the machine's failure."""
    task = agent_spec.task
    if task.verifier_sandbox is VerifierSandbox.AGENT:
        yield agent_box
        return
    # Nothing of the agent's run but its workdir: no proxy, no egress, no harness mounts.
    spec = replace(
        agent_spec,
        rollout_id=agent_spec.rollout_id + GRADING_SUFFIX,
        proxy_socket=None,
        mounts=(),
        image=image,
        env={},
        egress=None,
    )
    with tempfile.TemporaryDirectory(prefix="rolltap-work-") as tmp:
        work = Path(tmp) / "work"
        await agent_box.get(agent_box.workdir, work)
        box = await provider.create(spec)
        try:
            await provision(box, task, log=log)
            # The workdir as the agent left it, whole: what setup put there the agent saw too.
            await box.fresh_dir(box.workdir)
            await box.put(work, box.workdir)
            yield box
        finally:
            await box.close()
